// kvlab policies: lists the registered attention policies (built-ins, and plugins loaded with
// --plugin PATH) with their parameters: name, type, default, allowed values and a one-line doc.
#include <cstdio>
#include <string>
#include <vector>

#include "framework/cli/options.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab::cli {
namespace {


void print_policy(const PolicyRegistry& registry, const std::string& name) {
  const PolicyFactory& f = registry.at(name);
  const std::string origin = registry.origin(name);
  std::printf("%s  -  %s%s\n", name.c_str(), f.doc().c_str(),
              origin == "built-in" ? "" : ("  [plugin " + origin + "]").c_str());
  for (const ParamSpec& p : f.params()) {
    std::string extra;
    if (!p.choices.empty()) {
      for (const auto& c : p.choices) extra += (extra.empty() ? "" : "|") + c;
      extra = " {" + extra + "}";
    } else if (p.min || p.max) {
      extra = " [" + (p.min ? to_string(ParamValue(*p.min)) : std::string("-inf")) + ", " +
              (p.max ? to_string(ParamValue(*p.max)) : std::string("inf")) + "]";
    }
    std::printf("    %-16s %-6s = %-10s%s  %s\n", p.name.c_str(), to_string(p.type),
                to_string(p.default_value).c_str(), extra.c_str(), p.doc.c_str());
  }
}

}  // namespace

int run_policies(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("plugin", po::value<std::vector<std::string>>()->composing(),
       "load a policy plugin (shared library) first (repeatable)")
      ("name", po::value<std::string>(), "show only this policy")
      ("names-only", po::bool_switch(), "print only the names, one per line")
      ("instantiate", po::bool_switch(),
       "also create each listed policy with its defaults and its unlimited parameters (a smoke "
       "test for plugins)");
  po::variables_map vm;
  if (!parse_options(args, args[0] + " [--plugin PATH]... [--name NAME]", desc, {}, vm)) return 0;

  PolicyRegistry registry = make_builtin_registry();
  if (vm.count("plugin"))
    for (const auto& path : vm["plugin"].as<std::vector<std::string>>()) registry.load_plugin(path);
  std::vector<std::string> names =
      vm.count("name") ? std::vector<std::string>{registry.at(vm["name"].as<std::string>()).name()}
                       : registry.names();
  if (vm["instantiate"].as<bool>()) {
    const PolicyModelShape shape{12, 12, 12, 64, 4096};
    for (const std::string& n : names) {
      registry.create(n, {}, shape, n + ".defaults");
      if (auto unlimited = registry.at(n).unlimited_params())
        registry.create(n, *unlimited, shape, n + ".unlimited");
    }
    std::printf("instantiated %zu %s with defaults and unlimited parameters (shape: %d layers, %d heads, "
                "%d KV heads, head_dim %d, context %d): ok\n\n",
                names.size(), names.size() == 1 ? "policy" : "policies", shape.n_layers, shape.n_heads,
                shape.n_kv_heads, shape.head_dim, shape.max_seq_len);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (vm["names-only"].as<bool>()) {
      std::printf("%s\n", names[i].c_str());
      continue;
    }
    if (i) std::printf("\n");
    print_policy(registry, names[i]);
  }
  return 0;
}

}  // namespace kvlab::cli
