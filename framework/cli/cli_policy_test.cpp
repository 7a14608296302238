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

}  // namespace
}  // namespace kvlab
