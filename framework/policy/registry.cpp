#include "framework/policy/registry.h"

#include <dlfcn.h>

#include <algorithm>

#include "framework/core/error.h"
#include "framework/core/strings.h"
#include "framework/policy/plugin.h"

namespace kvlab {


void PolicyRegistry::add(std::unique_ptr<PolicyFactory> factory) {
  add_entry(std::move(factory), "built-in");
}

void PolicyRegistry::add_entry(std::unique_ptr<PolicyFactory> factory, std::string origin) {
  KVLAB_CHECK(factory != nullptr);
  std::string name = factory->name();
  if (name.empty()) fail(origin, ": policy factory has an empty name");
  if (auto it = entries_.find(name); it != entries_.end())
    fail("policy '", name, "' from ", origin, " is already registered (from ", it->second.origin,
         ")");
  entries_.emplace(std::move(name), Entry{std::move(factory), std::move(origin)});
}

const PolicyFactory* PolicyRegistry::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.factory.get();
}

const PolicyFactory& PolicyRegistry::at(std::string_view name) const {
  if (const PolicyFactory* f = find(name)) return *f;
  std::string msg = str_cat("unknown policy '", name, "'");
  const std::string best = nearest_name(name, names());
  if (!best.empty()) msg += str_cat(" (did you mean '", best, "'?)");
  std::string all;
  for (const auto& [n, e] : entries_) all += (all.empty() ? "" : ", ") + n;
  fail(msg, "; registered: ", all.empty() ? "none" : all);
}

std::vector<std::string> PolicyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : entries_) out.push_back(n);
  return out;
}

std::string PolicyRegistry::origin(std::string_view name) const {
  at(name);
  return entries_.find(name)->second.origin;
}

std::unique_ptr<AttentionPolicy> PolicyRegistry::create(
    std::string_view name, const std::map<std::string, ParamValue>& raw,
    const PolicyModelShape& shape, const std::string& context) const {
  const PolicyFactory& f = at(name);
  const ParamValues values = validate_params(f.name(), f.params(), raw, context);
  std::unique_ptr<AttentionPolicy> policy;
  try {
    policy = f.create(values, shape);
  } catch (const Error& e) {
    // A combination of valid values the policy refuses (units: ratio with heavy: 64, a budget
    // beside a changed window): one error naming where the parameters came from and the policy.
    fail(context, ": policy '", f.name(), "': ", e.what());
  }
  if (!policy) fail("policy '", f.name(), "' returned no policy object");
  return policy;
}

std::map<std::string, ParamValue> PolicyRegistry::effective_params(
    std::string_view name, const std::map<std::string, ParamValue>& raw,
    const PolicyModelShape& shape, const std::string& context) const {
  const PolicyFactory& f = at(name);
  return f.effective_params(validate_params(f.name(), f.params(), raw, context), shape);
}

std::vector<std::string> PolicyRegistry::load_plugin(const std::filesystem::path& path) {
  const std::string file = path.string();
  // RTLD_NODELETE: policies made by the plugin may outlive this registry (never unloaded).
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    const char* err = dlerror();
    fail(file, ": cannot load policy plugin: ", err ? err : "dlopen failed");
  }
  dlerror();
  void* sym = dlsym(handle, kKvlabPolicyPluginSymbol);
  if (!sym) {
    const char* err = dlerror();
    fail(file, ": policy plugin has no entry point '", kKvlabPolicyPluginSymbol,
         "' (declare it extern \"C\", see framework/policy/plugin.h): ",
         err ? err : "symbol not found");
  }
  using EntryFn = const KvlabPolicyPlugin* (*)();
  const KvlabPolicyPlugin* plugin = reinterpret_cast<EntryFn>(sym)();
  if (!plugin) fail(file, ": ", kKvlabPolicyPluginSymbol, "() returned null");
  // api_version first: the rest of the descriptor is only read once the layouts agree.
  if (plugin->api_version != kKvlabPolicyApiVersion)
    fail(file, ": policy plugin API version ", plugin->api_version, " (symbol ",
         kKvlabPolicyPluginSymbol, ") does not match this kvlab's API version ",
         kKvlabPolicyApiVersion, "; rebuild the plugin against this kvlab");
  const bool one = plugin->name || plugin->create_factory;
  const bool list = plugin->n_policies || plugin->policies;
  if (one == list)
    fail(file, ": ", kKvlabPolicyPluginSymbol, "() returned a descriptor with ",
         one ? "both one policy (name, create_factory) and a list (n_policies, policies)"
             : "no policy (neither name + create_factory nor n_policies + policies)");
  if (list && (!plugin->policies || !plugin->n_policies))
    fail(file, ": ", kKvlabPolicyPluginSymbol, "() returned a descriptor with n_policies ",
         plugin->n_policies, " and ", plugin->policies ? "a" : "no", " policies list");
  std::vector<KvlabPolicyPluginEntry> wanted;
  if (one) wanted.push_back({plugin->name, plugin->create_factory});
  else wanted.assign(plugin->policies, plugin->policies + plugin->n_policies);
  // Create and check every factory before registering any, so a failing plugin adds nothing.
  std::vector<std::unique_ptr<PolicyFactory>> factories;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const KvlabPolicyPluginEntry& e = wanted[i];
    const std::string which = one ? std::string("its descriptor") : str_cat("policies[", i, "]");
    if (!e.name || !e.create_factory)
      fail(file, ": ", kKvlabPolicyPluginSymbol, "() returned a descriptor whose ", which,
           " has no name or no factory");
    std::unique_ptr<PolicyFactory> factory;
    try {
      factory.reset(e.create_factory());
    } catch (const std::exception& ex) {
      fail(file, ": plugin '", e.name, "' failed to create its factory: ", ex.what());
    }
    if (!factory) fail(file, ": plugin '", e.name, "' returned no factory");
    if (factory->name() != e.name)
      fail(file, ": plugin descriptor names '", e.name, "' but its factory names '", factory->name(), "'");
    if (auto it = entries_.find(factory->name()); it != entries_.end())
      fail("policy '", factory->name(), "' from ", file, " is already registered (from ", it->second.origin, ")");
    for (const auto& f : factories)
      if (f->name() == factory->name()) fail(file, ": plugin lists policy '", f->name(), "' twice");
    factories.push_back(std::move(factory));
  }
  std::vector<std::string> names;
  for (auto& f : factories) {
    names.push_back(f->name());
    add_entry(std::move(f), file);
  }
  return names;
}

}  // namespace kvlab
