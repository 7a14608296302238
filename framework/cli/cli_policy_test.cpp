// --policy / --policy-param / --plugin (moved from framework/policy/registry_test.cpp with the code).
#include "framework/cli/cli_policy.h"

#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "framework/core/error_testing.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

using testing::error_of;

const PolicyModelShape kShape{2, 4, 2, 8, 512};

TEST(PolicyCli, PolicyAndParamsFromOptions) {
  namespace po = boost::program_options;
  po::options_description desc;
  add_policy_options(desc);
  const char* argv[] = {"x", "--policy", "sinks", "--policy-param", "recent=32",
                        "--policy-param", "rope_positions=original"};
  po::variables_map vm;
  po::store(po::parse_command_line(7, argv, desc), vm);
  po::notify(vm);
  PolicyRegistry r = make_builtin_registry();
  PolicyMaker make = make_policy_maker_from_options(vm, r, kShape);
  auto p = make();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->budget_tokens(0, 1000), 4 + 32);
  EXPECT_FALSE(p->needs().rope_at_cache_position);

  PolicyChoice bad;
  bad.name = "sinks";
  bad.params = {{"recnt", int64_t(3)}};
  const std::string e = error_of([&] { make_policy_maker(bad, r, kShape); });
  EXPECT_NE(e.find("--policy-param.recnt"), std::string::npos) << e;
  po::variables_map vm2;
  const char* argv2[] = {"x", "--policy-param", "noequals"};
  po::store(po::parse_command_line(3, argv2, desc), vm2);
  EXPECT_NE(error_of([&] { policy_choice_from_options(vm2); }).find("KEY=VALUE"), std::string::npos);
}

// Issue 13: every parameter hole through --policy-param, one error each naming the option, the
// key, the policy and the accepted form.
TEST(PolicyCli, HolesAreOneErrorEach) {
  namespace po = boost::program_options;
  po::options_description desc;
  add_policy_options(desc);
  PolicyRegistry r = make_builtin_registry();
  auto message = [&](const std::string& policy, const std::string& param) {
    const std::vector<std::string> args = {"x", "--policy", policy, "--policy-param", param};
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    po::variables_map vm;
    po::store(po::parse_command_line(int(argv.size()), argv.data(), desc), vm);
    po::notify(vm);
    return error_of([&] { make_policy_maker_from_options(vm, r, kShape); });
  };
  const std::string int_form = "expects int (decimal digits with an optional sign, at most 2^53 in magnitude";
  const std::string float_form = "expects float (a finite decimal number";
  struct Hole {
    std::string policy, param, expect;
  };
  const std::vector<Hole> holes = {
      {"sliding_window", "window=0x10", "--policy-param.window: policy 'sliding_window' " + int_form},
      {"sliding_window", "window=1e3", "--policy-param.window: policy 'sliding_window' " + int_form},
      {"sliding_window", "window=1.5", "got 1.5 (a float)"},
      {"sinks", "recent=9223372036854775808", "(past int64)"},
      {"sinks", "sinks=-9223372036854775809", "(past int64)"},
      {"sinks", "recent=1152921504606846976", "--policy-param.recent: policy 'sinks' expects an int within +-2^53"},
      {"h2o", "heavy=nan", "--policy-param.heavy: policy 'h2o' " + float_form},
      {"h2o", "heavy=inf", "--policy-param.heavy: policy 'h2o' " + float_form},
      {"h2o", "heavy=-inf", "--policy-param.heavy: policy 'h2o' " + float_form},
      {"h2o", "recent=NaN", "--policy-param.recent: policy 'h2o' " + float_form},
      {"h2o", "heavy=64", "--policy-param: policy 'h2o': heavy = 64 with units: ratio (the default): a ratio "
                          "must be in [0, 1]"},
      {"sliding_window", "compression_ratio=nan", "--policy-param.compression_ratio: policy 'sliding_window' " + float_form},
      {"landmark", "budget_tokens=1e3", "--policy-param.budget_tokens: policy 'landmark' " + int_form},
      {"sinks", "budget_tokens=4", "--policy-param: policy 'sinks': budget_tokens (4) must exceed sinks (4)"},
  };
  for (const Hole& h : holes) {
    const std::string e = message(h.policy, h.param);
    EXPECT_NE(e.find(h.expect), std::string::npos) << h.param << ": " << e;
  }
  EXPECT_EQ(message("landmark", "gqa=per_head"), "");  // accepted (error_of: "" when nothing is thrown)
}

}  // namespace
}  // namespace kvlab
