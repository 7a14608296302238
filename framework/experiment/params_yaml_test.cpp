// Raw policy parameters from YAML (moved from framework/policy/registry_test.cpp with the code).
#include "framework/experiment/params_yaml.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "framework/core/error.h"
#include "framework/core/error_testing.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

using testing::error_of;

const PolicyModelShape kShape{2, 4, 2, 8, 512};

TEST(PolicyParams, FromYaml) {
  YAML::Node n = YAML::Load("{heavy: 0.2, recent: 16, units: tokens, sinks: '4'}");
  auto raw = raw_params_from_yaml(n, "policies[0].params");
  EXPECT_EQ(std::get<double>(raw.at("heavy")), 0.2);
  EXPECT_EQ(std::get<int64_t>(raw.at("recent")), 16);
  EXPECT_EQ(std::get<std::string>(raw.at("units")), "tokens");
  EXPECT_EQ(std::get<std::string>(raw.at("sinks")), "4");  // quoted: a string
  PolicyRegistry r = make_builtin_registry();
  const std::string e = error_of([&] { r.create("h2o", raw, kShape, "policies[0].params"); });
  EXPECT_NE(e.find("policies[0].params.sinks"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { raw_params_from_yaml(YAML::Load("{a: [1, 2]}"), "p"); }).find("p.a"),
            std::string::npos);
  EXPECT_NE(error_of([&] { raw_params_from_yaml(YAML::Load("[1, 2]"), "p"); }).find("mapping"),
            std::string::npos);
  EXPECT_TRUE(raw_params_from_yaml(YAML::Node(), "p").empty());
}

}  // namespace
}  // namespace kvlab
