#include "framework/cli/cli_policy.h"

#include "framework/core/error.h"

namespace kvlab {

namespace po = boost::program_options;

void add_policy_options(po::options_description& desc) {
  desc.add_options()
      ("policy", po::value<std::string>()->default_value("full"),
       "attention policy (kvlab policies lists them)")
      ("policy-param", po::value<std::vector<std::string>>()->composing(),
       "policy parameter KEY=VALUE (repeatable)")
      ("plugin", po::value<std::vector<std::string>>()->composing(),
       "load a policy plugin (shared library) first (repeatable)");
}

PolicyChoice policy_choice_from_options(const po::variables_map& vm) {
  PolicyChoice c;
  if (vm.count("policy")) c.name = vm["policy"].as<std::string>();
  if (vm.count("plugin")) c.plugins = vm["plugin"].as<std::vector<std::string>>();
  if (vm.count("policy-param"))
    for (const std::string& kv : vm["policy-param"].as<std::vector<std::string>>()) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        fail("--policy-param '", kv, "': expected KEY=VALUE");
      c.params[kv.substr(0, eq)] = parse_param_text(kv.substr(eq + 1));
    }
  return c;
}

PolicyMaker make_policy_maker(const PolicyChoice& choice, PolicyRegistry& registry,
                              const PolicyModelShape& shape) {
  for (const std::string& p : choice.plugins) registry.load_plugin(p);
  const PolicyFactory& f = registry.at(choice.name);
  const ParamValues values = validate_params(f.name(), f.params(), choice.params, "--policy-param");
  // Surfaces construction errors (bad combinations) now, naming --policy-param and the policy.
  registry.create(choice.name, choice.params, shape, "--policy-param");
  return [&f, values, shape]() { return f.create(values, shape); };
}

PolicyMaker make_policy_maker_from_options(const po::variables_map& vm, PolicyRegistry& registry,
                                           const PolicyModelShape& shape) {
  return make_policy_maker(policy_choice_from_options(vm), registry, shape);
}

std::unique_ptr<AttentionPolicy> make_policy_from_options(const po::variables_map& vm,
                                                          PolicyRegistry& registry,
                                                          const PolicyModelShape& shape) {
  return make_policy_maker_from_options(vm, registry, shape)();
}

}  // namespace kvlab
