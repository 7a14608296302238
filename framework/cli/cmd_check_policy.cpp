// kvlab check-policy: runs the policy conformance suite (policies/conformance.h: the checks of
// policy_conformance_test and policy_engine_conformance_test) on the policies of a plugin, through
// the engine-free simulator and through the real engine on a random-weight model. One line per
// check, a summary, exit status 1 when any check fails.
//
//   kvlab check-policy --plugin build/plugins/knorm.so            every policy of the plugin
//   kvlab check-policy --plugin mine.so --policy a --policy b     only these
//   kvlab check-policy --policy h2o                               a built-in
#include <cstdio>
#include <string>
#include <vector>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"
#include "policies/conformance.h"

namespace kvlab::cli {

int run_check_policy(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("plugin", po::value<std::vector<std::string>>()->composing(),
       "load a policy plugin (shared library); its policies are checked (repeatable)")
      ("policy", po::value<std::vector<std::string>>()->composing(),
       "check only this policy (repeatable; a built-in may be named too)")
      ("check", po::value<std::vector<std::string>>()->composing(),
       "run only this check (repeatable; names as printed, e.g. sim.invariants)");
  po::variables_map vm;
  if (!parse_options(args, args[0] + " --plugin FILE.so [--policy NAME]...", desc, {}, vm)) return 0;

  PolicyRegistry registry = make_builtin_registry();
  std::vector<std::string> names;
  if (vm.count("plugin"))
    for (const auto& path : vm["plugin"].as<std::vector<std::string>>())
      for (std::string& n : registry.load_plugin(path)) names.push_back(std::move(n));
  if (vm.count("policy")) {
    names.clear();
    for (const auto& n : vm["policy"].as<std::vector<std::string>>()) names.push_back(registry.at(n).name());
  }
  if (names.empty()) fail("check-policy: nothing to check: give --plugin FILE.so (and/or --policy NAME)");
  std::vector<std::string> only;
  if (vm.count("check"))
    for (const auto& c : vm["check"].as<std::vector<std::string>>()) only.push_back(conformance::check_named(c).name);

  for (const std::string& n : names) {
    const std::vector<conformance::Case> own = conformance::cases(registry, {n});
    int declared = 0, compat = 0;
    for (const conformance::Case& c : own) (c.declared ? declared : compat)++;
    std::string from = str_cat(declared, " from its factory");
    if (compat && !declared && own.size() == 1 && own[0].config.params.empty())
      from += " (none supplied: run with its defaults, no flag checked; see PolicyFactory::conformance_configs)";
    else if (compat)
      from += str_cat(", ", compat, " from the compat table (flags not checked)");
    std::printf("policy %s (%s): conformance configurations: %s\n", n.c_str(), registry.origin(n).c_str(),
                from.c_str());
  }
  int passed = 0, failed = 0, skipped = 0;
  auto print = [&](const conformance::Outcome& o) {
    const char* tag = o.verdict.kind == conformance::Verdict::kPass   ? "PASS"
                      : o.verdict.kind == conformance::Verdict::kFail ? "FAIL"
                                                                      : "SKIP";
    (o.verdict.kind == conformance::Verdict::kPass ? passed : o.verdict.kind == conformance::Verdict::kFail ? failed : skipped)++;
    std::printf("%s  %-32s %s%s%s\n", tag, o.check.c_str(), o.subject.c_str(), o.verdict.detail.empty() ? "" : ": ",
                o.verdict.detail.c_str());
    std::fflush(stdout);
  };
  if (only.empty()) {
    conformance::run_all(registry, names, print);
  } else {
    const std::vector<conformance::Case> all = conformance::cases(registry, names);
    for (const std::string& name : only)
      conformance::run_check_over(conformance::check_named(name), registry, names, all, print);
  }
  std::printf("check-policy: %d checks: %d passed, %d failed, %d skipped\n", passed + failed + skipped, passed,
              failed, skipped);
  return failed ? 1 : 0;
}

}  // namespace kvlab::cli
