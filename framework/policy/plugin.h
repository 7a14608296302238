// The policy plugin ABI: a shared library that adds one or several policies to a kvlab binary at
// run time.
//
// A plugin exports exactly one C entry point,
//
//   extern "C" const KvlabPolicyPlugin* kvlab_policy_plugin();
//
// returning a pointer to a static descriptor. Its first field, api_version, is read before
// anything else: the loader (PolicyRegistry::load_plugin) dlopens the file, finds the symbol,
// checks api_version against kKvlabPolicyApiVersion (a mismatch names both versions) and only
// then reads the rest. The descriptor holds either one policy (name + create_factory, the
// KVLAB_POLICY_PLUGIN macro) or a list (n_policies entries of {name, create_factory},
// KVLAB_POLICY_PLUGINS), never both. The loader creates every factory, checks each registry name
// equals factory->name() and is new, and registers all of them or none. Errors name the file
// and, for a missing entry point, the symbol.
//
// The plugin is compiled against the same kvlab headers (policy.h, params.h, policies/scorer.h,
// installed by `cmake --install build --component policy_api`) and resolves kvlab's out-of-line
// symbols (ParamValues getters, ScorerPolicy) from the kvlab executable, which is linked with
// ENABLE_EXPORTS. Nothing else is shared: the factory and the policies it makes are C++ objects
// of the plugin, destroyed through their virtual destructors. Plugins are never unloaded (the
// code of live policy objects must outlive every registry).
//
// Bump kKvlabPolicyApiVersion whenever policy.h, params.h, policies/scorer.h (or the headers
// they include) change in a way that alters a class layout or a virtual table, or this
// descriptor changes.
#pragma once

#include <cstdint>

namespace kvlab {
class PolicyFactory;
}

// 2: PolicyNeeds::prefill_mask. 3: PolicyFactory::effective_params.
// 4: LayerStep::prompt_end and ::seed; PolicyNeeds::queries, ::observation_window,
//    ::observe_every_step and StepStats::window_attention (the observation window);
//    PolicyFactory::conformance_configs (conformance traits supplied by each factory);
//    several policies per library (KvlabPolicyPlugin::n_policies / policies).
inline constexpr uint32_t kKvlabPolicyApiVersion = 4;
inline constexpr const char* kKvlabPolicyPluginSymbol = "kvlab_policy_plugin";

extern "C" {
// One policy of a plugin: its registry name and a maker of its factory (a new object owned by
// the caller, deleted through PolicyFactory's virtual destructor).
struct KvlabPolicyPluginEntry {
  const char* name;
  kvlab::PolicyFactory* (*create_factory)();
};

struct KvlabPolicyPlugin {
  uint32_t api_version;  // kKvlabPolicyApiVersion at the plugin's build time (read first)
  // One policy: its registry name and factory maker; nullptr when `policies` is used.
  const char* name;
  kvlab::PolicyFactory* (*create_factory)();
  // Several policies: n_policies entries; 0 / nullptr for a one-policy plugin.
  uint32_t n_policies;
  const KvlabPolicyPluginEntry* policies;
};
}

// Defines the entry point for a plugin holding one PolicyFactory subclass FACTORY with a
// default constructor, registered as NAME.
#define KVLAB_POLICY_PLUGIN(NAME, FACTORY)                                                          \
  extern "C" __attribute__((visibility("default"))) const KvlabPolicyPlugin* kvlab_policy_plugin() { \
    static const KvlabPolicyPlugin plugin{                                                          \
        kKvlabPolicyApiVersion, NAME, []() -> kvlab::PolicyFactory* { return new FACTORY(); }, 0,    \
        nullptr};                                                                                   \
    return &plugin;                                                                                 \
  }

// One entry of KVLAB_POLICY_PLUGINS: FACTORY (a PolicyFactory subclass with a default
// constructor) registered as NAME.
#define KVLAB_POLICY_ENTRY(NAME, FACTORY) \
  KvlabPolicyPluginEntry { NAME, []() -> kvlab::PolicyFactory* { return new FACTORY(); } }

// Defines the entry point for a plugin holding several policies:
//   KVLAB_POLICY_PLUGINS(KVLAB_POLICY_ENTRY("a", AFactory), KVLAB_POLICY_ENTRY("b", BFactory))
#define KVLAB_POLICY_PLUGINS(...)                                                                   \
  extern "C" __attribute__((visibility("default"))) const KvlabPolicyPlugin* kvlab_policy_plugin() { \
    static const KvlabPolicyPluginEntry entries[] = {__VA_ARGS__};                                  \
    static const KvlabPolicyPlugin plugin{kKvlabPolicyApiVersion, nullptr, nullptr,                 \
                                          uint32_t(sizeof(entries) / sizeof(entries[0])), entries}; \
    return &plugin;                                                                                 \
  }
