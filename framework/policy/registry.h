// PolicyRegistry: the named policies a run can choose from. An ordinary object (no hidden
// global): built-ins are added explicitly (register_builtin_policies in policies/builtin.h),
// plugins with load_plugin(path) (ABI in plugin.h).
//
// Contract:
//   add(factory)         registers under factory->name(); a duplicate name throws.
//   find(name)           the factory or nullptr.
//   at(name)             the factory or throws kvlab::Error "unknown policy 'x' (did you mean
//                        'y'?); registered: a, b, c".
//   names()              sorted.
//   create(name, raw, shape, context)
//                        validates raw parameters (unknown / ill-typed / out of range -> Error
//                        naming the policy and `context.key`), fills defaults, makes a policy.
//   effective_params(name, raw, shape, context)
//                        the same validation; the parameters that policy really runs with.
//   load_plugin(path)    dlopen + entry point + version check + add every policy of the plugin
//                        (all or none); returns their names.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "framework/policy/params.h"
#include "framework/policy/policy.h"

namespace kvlab {

class PolicyRegistry {
 public:
  PolicyRegistry() = default;
  PolicyRegistry(const PolicyRegistry&) = delete;
  PolicyRegistry& operator=(const PolicyRegistry&) = delete;
  PolicyRegistry(PolicyRegistry&&) = default;
  PolicyRegistry& operator=(PolicyRegistry&&) = default;

  void add(std::unique_ptr<PolicyFactory> factory);
  const PolicyFactory* find(std::string_view name) const;
  const PolicyFactory& at(std::string_view name) const;
  std::vector<std::string> names() const;
  // Where a policy came from: "built-in" or the plugin's file path.
  std::string origin(std::string_view name) const;

  std::unique_ptr<AttentionPolicy> create(std::string_view name,
                                          const std::map<std::string, ParamValue>& raw,
                                          const PolicyModelShape& shape,
                                          const std::string& context = "params") const;

  // The parameters create(name, raw, shape) runs with: validated, defaults filled, "auto"
  // values resolved (PolicyFactory::effective_params).
  std::map<std::string, ParamValue> effective_params(std::string_view name,
                                                     const std::map<std::string, ParamValue>& raw,
                                                     const PolicyModelShape& shape,
                                                     const std::string& context = "params") const;

  // Returns the names of the policies the plugin registered (one or several; all or none).
  std::vector<std::string> load_plugin(const std::filesystem::path& path);

 private:
  struct Entry {
    std::unique_ptr<PolicyFactory> factory;
    std::string origin;
  };
  void add_entry(std::unique_ptr<PolicyFactory> factory, std::string origin);
  std::map<std::string, Entry, std::less<>> entries_;
};


}  // namespace kvlab
