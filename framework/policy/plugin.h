// The policy plugin ABI: a shared library that adds one policy to a kvlab binary at run time.
//
// A plugin exports exactly one C entry point,
//
//   extern "C" const KvlabPolicyPlugin* kvlab_policy_plugin();
//
// returning a pointer to a static descriptor {api_version, name, create_factory}. The loader
// (PolicyRegistry::load_plugin) dlopens the file, finds the symbol, checks api_version against
// kKvlabPolicyApiVersion (a mismatch names both versions), calls create_factory() and registers
// the factory under `name` (which must equal factory->name()). Errors name the file and, for a
// missing entry point, the symbol.
//
// The plugin is compiled against the same kvlab headers (policy.h, params.h, policies/scorer.h)
// and resolves kvlab's out-of-line symbols (ParamValues getters, ScorerPolicy) from the kvlab
// executable, which is linked with ENABLE_EXPORTS. Nothing else is shared: the factory and the
// policies it makes are C++ objects of the plugin, destroyed through their virtual destructors.
// Plugins are never unloaded (the code of live policy objects must outlive every registry).
//
// Bump kKvlabPolicyApiVersion whenever policy.h, params.h or policies/scorer.h change in a way
// that alters a class layout or a virtual table.
#pragma once

#include <cstdint>

namespace kvlab {
class PolicyFactory;
}

inline constexpr uint32_t kKvlabPolicyApiVersion = 3;  // 2: PolicyNeeds::prefill_mask; 3: PolicyFactory::effective_params
inline constexpr const char* kKvlabPolicyPluginSymbol = "kvlab_policy_plugin";

extern "C" {
struct KvlabPolicyPlugin {
  uint32_t api_version;  // kKvlabPolicyApiVersion at the plugin's build time
  const char* name;      // the policy's registry name
  // Returns a new factory owned by the caller (deleted through PolicyFactory's virtual dtor).
  kvlab::PolicyFactory* (*create_factory)();
};
}

// Defines the entry point for a plugin holding one PolicyFactory subclass FACTORY with a
// default constructor, registered as NAME.
#define KVLAB_POLICY_PLUGIN(NAME, FACTORY)                                         \
  extern "C" __attribute__((visibility("default"))) const KvlabPolicyPlugin*       \
  kvlab_policy_plugin() {                                                          \
    static const KvlabPolicyPlugin plugin{                                         \
        kKvlabPolicyApiVersion, NAME, []() -> kvlab::PolicyFactory* { return new FACTORY(); }}; \
    return &plugin;                                                                \
  }
