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

// Issue 13: every parameter hole through the YAML reader, one error each naming the context,
// the key, the policy and the accepted form (YAML's own spellings .nan / .inf included).
TEST(PolicyParams, HolesFromYamlAreOneErrorEach) {
  PolicyRegistry r = make_builtin_registry();
  struct Hole {
    std::string policy, yaml, expect;
  };
  const std::string int_form = "expects int (decimal digits with an optional sign, at most 2^53 in magnitude";
  const std::string float_form = "expects float (a finite decimal number";
  const std::vector<Hole> holes = {
      {"sliding_window", "{window: 0x10}", "policies[0].params.window: policy 'sliding_window' " + int_form},
      {"sliding_window", "{window: 1e3}", "policies[0].params.window: policy 'sliding_window' " + int_form},
      {"sliding_window", "{window: 1.5}", "got 1.5 (a float)"},
      {"sinks", "{recent: 9223372036854775808}", "policies[0].params.recent: policy 'sinks' " + int_form},
      {"sinks", "{recent: 9223372036854775808}", "(past int64)"},
      {"sinks", "{recent: 99999999999999999999}", "(past int64)"},
      {"sinks", "{recent: 1152921504606846976}", "policies[0].params.recent: policy 'sinks' expects an int within +-2^53"},
      {"h2o", "{heavy: nan}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{heavy: .nan}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{heavy: inf}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{heavy: .inf}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{heavy: -inf}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{recent: -.inf}", "policies[0].params.recent: policy 'h2o' " + float_form},
      {"h2o", "{heavy: 1e400}", "policies[0].params.heavy: policy 'h2o' " + float_form},
      {"h2o", "{heavy: 64}", "policies[0].params: policy 'h2o': heavy = 64 with units: ratio (the default): "
                             "a ratio must be in [0, 1] (a fraction of the tokens seen); for a token count set "
                             "units: tokens"},
      {"landmark", "{gqa: per_heads}", "policies[0].params.gqa: policy 'landmark' expects one of softmax_max | "
                                       "max | sum | per_head, got 'per_heads'"},
  };
  for (const Hole& h : holes) {
    const auto raw = raw_params_from_yaml(YAML::Load(h.yaml), "policies[0].params");
    const std::string e = error_of([&] { r.create(h.policy, raw, kShape, "policies[0].params"); });
    EXPECT_NE(e.find(h.expect), std::string::npos) << h.yaml << ": " << e;
  }
  // The accepted forms pass.
  for (const std::string yaml : {"{heavy: 0.25, recent: 1e-1}", "{heavy: 64, recent: 64, units: tokens}"})
    EXPECT_NE(r.create("h2o", raw_params_from_yaml(YAML::Load(yaml), "p"), kShape), nullptr) << yaml;
  EXPECT_NE(r.create("landmark", raw_params_from_yaml(YAML::Load("{gqa: per_head}"), "p"), kShape), nullptr);
}

}  // namespace
}  // namespace kvlab
