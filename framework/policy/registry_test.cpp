// Registry, parameter validation and plugin-loader error reporting (parameters from YAML:
// framework/experiment/params_yaml_test.cpp; from the command line: framework/cli/cli_policy_test.cpp).
#include "framework/policy/registry.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <cmath>

#include "framework/core/error.h"
#include "framework/core/error_testing.h"
#include "framework/policy/plugin.h"
#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

using testing::error_of;

const PolicyModelShape kShape{2, 4, 2, 8, 512};

TEST(PolicyRegistry, HoldsTheBuiltins) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_EQ(r.names(), (std::vector<std::string>{"adakv", "duo", "full", "h2o", "knorm", "landmark",
                                                  "pyramidkv", "quest", "random", "sinks", "sliding_window",
                                                  "snapkv", "strided", "tova"}));
  for (const auto& n : r.names()) {
    EXPECT_EQ(r.at(n).name(), n);
    EXPECT_FALSE(r.at(n).doc().empty());
    EXPECT_EQ(r.origin(n), "built-in");
    for (const ParamSpec& p : r.at(n).params()) EXPECT_FALSE(p.doc.empty()) << n << "." << p.name;
    EXPECT_TRUE(r.at(n).unlimited_params().has_value()) << n;
    EXPECT_NE(r.create(n, {}, kShape), nullptr);  // defaults are valid
  }
}

TEST(PolicyRegistry, UnknownNameSuggestsNearest) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_EQ(r.find("h20"), nullptr);
  const std::string e = error_of([&] { r.at("h20"); });
  EXPECT_NE(e.find("unknown policy 'h20'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'h2o'"), std::string::npos) << e;
  EXPECT_NE(e.find("sliding_window"), std::string::npos) << e;  // lists registered
}

TEST(PolicyRegistry, DuplicateNameThrows) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_NE(error_of([&] { r.add(make_full_factory()); }).find("already registered"),
            std::string::npos);
}

TEST(PolicyRegistry, UnknownAndIllTypedParamsNamePolicyAndKey) {
  PolicyRegistry r = make_builtin_registry();
  std::string e = error_of([&] { r.create("h2o", {{"heavvy", 0.2}}, kShape, "policies[1].params"); });
  EXPECT_NE(e.find("policies[1].params.heavvy"), std::string::npos) << e;
  EXPECT_NE(e.find("'h2o'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'heavy'"), std::string::npos) << e;
  e = error_of([&] { r.create("sliding_window", {{"window", std::string("big")}}, kShape); });
  EXPECT_NE(e.find("params.window"), std::string::npos) << e;
  EXPECT_NE(e.find("expects int"), std::string::npos) << e;
  e = error_of([&] { r.create("sinks", {{"rope_positions", std::string("text")}}, kShape); });
  EXPECT_NE(e.find("cache | original"), std::string::npos) << e;
  e = error_of([&] { r.create("sliding_window", {{"window", int64_t(0)}}, kShape); });
  EXPECT_NE(e.find("window"), std::string::npos) << e;
  e = error_of([&] { r.create("h2o", {{"units", std::string("tokens")}, {"heavy", 2.5}}, kShape); });
  EXPECT_NE(e.find("whole numbers"), std::string::npos) << e;
}

TEST(PolicyPlugin, MissingFileNamesFile) {
  PolicyRegistry r;
  const std::string e = error_of([&] { r.load_plugin("/nonexistent/libnope.so"); });
  EXPECT_NE(e.find("/nonexistent/libnope.so"), std::string::npos) << e;
}

TEST(PolicyPlugin, MissingEntryPointNamesFileAndSymbol) {
  PolicyRegistry r;
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_NOSYM); });
  EXPECT_NE(e.find(KVLAB_TEST_PLUGIN_NOSYM), std::string::npos) << e;
  EXPECT_NE(e.find("kvlab_policy_plugin"), std::string::npos) << e;
}

TEST(PolicyRegistry, EffectiveParamsFillDefaultsAndResolveLandmarkAuto) {
  PolicyRegistry r = make_builtin_registry();
  // kShape: training context L = 512 < 8192, so landmark's 0 = auto scales down:
  // C = clamp(pow2_floor(512 / 128), 8, 64) = 8, W = clamp(512 / 16, 2C, 512) = 32,
  // K = clamp(512 / (4C), 2, 32) = 16.
  const auto e = r.effective_params("landmark", {}, kShape);
  EXPECT_EQ(std::get<int64_t>(e.at("chunk_size")), 8);
  EXPECT_EQ(std::get<int64_t>(e.at("window")), 32);
  EXPECT_EQ(std::get<int64_t>(e.at("top_k")), 16);
  EXPECT_EQ(std::get<int64_t>(e.at("sinks")), 4);
  EXPECT_EQ(std::get<std::string>(e.at("prefill")), "dense");
  // Written values stay as written; L >= 8192 gives the unscaled defaults.
  const auto w = r.effective_params("landmark", {{"top_k", int64_t(3)}}, PolicyModelShape{2, 4, 2, 8, 8192});
  EXPECT_EQ(std::get<int64_t>(w.at("top_k")), 3);
  EXPECT_EQ(std::get<int64_t>(w.at("chunk_size")), 64);
  EXPECT_EQ(std::get<int64_t>(w.at("window")), 512);
  // Policies without auto values: the validated parameters with their defaults.
  const auto s = r.effective_params("sinks", {{"recent", int64_t(8)}}, kShape);
  EXPECT_EQ(std::get<int64_t>(s.at("recent")), 8);
  EXPECT_EQ(std::get<std::string>(s.at("rope_positions")), "cache");
  EXPECT_THROW(r.effective_params("sinks", {{"recnt", int64_t(8)}}, kShape), Error);
}

// The installed kvlabConfig.cmake carries the header's API version (the regex once read the
// "32" of uint32_t).
TEST(PolicyPlugin, InstalledConfigCarriesTheHeadersApiVersion) {
  std::ifstream in(KVLAB_CONFIG_CMAKE);
  ASSERT_TRUE(in) << KVLAB_CONFIG_CMAKE;
  std::stringstream text;
  text << in.rdbuf();
  const std::string want = "set(KVLAB_POLICY_API_VERSION " + std::to_string(kKvlabPolicyApiVersion) + ")";
  EXPECT_NE(text.str().find(want), std::string::npos) << want << " not in\n" << text.str();
}

TEST(PolicyPlugin, VersionMismatchNamesBothVersions) {
  PolicyRegistry r;
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_BADVER); });
  EXPECT_NE(e.find(KVLAB_TEST_PLUGIN_BADVER), std::string::npos) << e;
  EXPECT_NE(e.find("API version " + std::to_string(kKvlabPolicyApiVersion + 998)), std::string::npos) << e;
  EXPECT_NE(e.find("API version " + std::to_string(kKvlabPolicyApiVersion) + ";"), std::string::npos) << e;
  EXPECT_TRUE(r.names().empty());
}

// API v4: one library, several policies; registered all together under the file's name.
TEST(PolicyPlugin, SeveralPoliciesFromOneLibrary) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_EQ(r.load_plugin(KVLAB_TEST_PLUGIN_PAIR), (std::vector<std::string>{"over_budget", "unseeded"}));
  for (const char* n : {"over_budget", "unseeded"}) {
    EXPECT_EQ(r.origin(n), KVLAB_TEST_PLUGIN_PAIR);
    EXPECT_EQ(r.at(n).name(), n);
    EXPECT_NE(r.create(n, {}, kShape), nullptr);
    EXPECT_EQ(r.at(n).conformance_configs().size(), 1u) << n;
  }
  // Loading it again: the error names the policy and both origins.
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_PAIR); });
  EXPECT_NE(e.find("'over_budget'"), std::string::npos) << e;
  EXPECT_NE(e.find("already registered"), std::string::npos) << e;
  EXPECT_NE(e.find(KVLAB_TEST_PLUGIN_PAIR), std::string::npos) << e;
}

// A plugin whose second policy clashes registers nothing (all or none).
TEST(PolicyPlugin, SeveralPoliciesAllOrNone) {
  PolicyRegistry r;
  r.add(std::make_unique<SimplePolicyFactory>(
      "unseeded", "a clash", ParamSpecs{},
      [](const ParamValues&, const PolicyModelShape&) -> std::unique_ptr<AttentionPolicy> { return nullptr; }));
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_PAIR); });
  EXPECT_NE(e.find("'unseeded'"), std::string::npos) << e;
  EXPECT_EQ(r.names(), std::vector<std::string>{"unseeded"});
  EXPECT_EQ(r.find("over_budget"), nullptr);
}

// A descriptor with both forms (one policy and a list) is refused, naming the file.
TEST(PolicyPlugin, DescriptorWithBothFormsIsRefused) {
  PolicyRegistry r;
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_BADDESC); });
  EXPECT_NE(e.find(KVLAB_TEST_PLUGIN_BADDESC), std::string::npos) << e;
  EXPECT_NE(e.find("both one policy"), std::string::npos) << e;
  EXPECT_TRUE(r.names().empty());
}

// A one-policy plugin built for this API version (the example) still loads.
TEST(PolicyPlugin, OnePolicyPluginLoads) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_EQ(r.load_plugin(KVLAB_EXAMPLE_PLUGIN), std::vector<std::string>{"knorm_plugin"});
  EXPECT_EQ(r.origin("knorm_plugin"), KVLAB_EXAMPLE_PLUGIN);
}

// Issue 11: numeric parameters take one spelling each and never reach an integer conversion
// with NaN, infinity or a value past int64.
TEST(PolicyParams, TextFormsOfNumbers) {
  EXPECT_EQ(std::get<int64_t>(parse_param_text("256")), 256);
  EXPECT_EQ(std::get<int64_t>(parse_param_text("-3")), -3);
  EXPECT_EQ(std::get<double>(parse_param_text("0.25")), 0.25);
  EXPECT_EQ(std::get<double>(parse_param_text("1e3")), 1000.0);
  EXPECT_EQ(std::get<double>(parse_param_text(".5")), 0.5);
  EXPECT_EQ(std::get<double>(parse_param_text("9223372036854775808")), 9223372036854775808.0);  // past int64
  for (const char* text : {"nan", "NaN", "inf", "-inf", "infinity", "1e400", "0x10", "0x1p3", "1_000",
                           " 5", "5 ", "1e", ".", "+", "--1", ".inf", ".nan"})
    EXPECT_TRUE(std::holds_alternative<std::string>(parse_param_text(text))) << text;
}

TEST(PolicyParams, NonFiniteFloatsAndNonDecimalIntsAreRefusedNamingTheForm) {
  PolicyRegistry r = make_builtin_registry();
  for (const char* text : {"nan", "inf", "1e400"}) {
    const std::string e = error_of(
        [&] { r.create("h2o", {{"heavy", parse_param_text(text)}}, kShape, "policies[0].params"); });
    EXPECT_NE(e.find("policies[0].params.heavy: policy 'h2o' expects float (a finite decimal number"),
              std::string::npos) << text << ": " << e;
  }
  // A NaN or infinity given as a value (plugins, code) is refused the same way.
  for (double x : {std::nan(""), HUGE_VAL}) {
    const std::string e = error_of([&] { r.create("h2o", {{"heavy", x}}, kShape, "p"); });
    EXPECT_NE(e.find("p.heavy: policy 'h2o' expects float"), std::string::npos) << e;
  }
  for (const char* text : {"0x10", "1e3", "256.0", "9223372036854775808", "99999999999999999999"}) {
    const std::string e = error_of(
        [&] { r.create("sliding_window", {{"window", parse_param_text(text)}}, kShape, "policies[1].params"); });
    EXPECT_NE(e.find("policies[1].params.window: policy 'sliding_window' expects int (decimal digits"),
              std::string::npos) << text << ": " << e;
  }
  const std::string big = error_of(
      [&] { r.create("sinks", {{"sinks", int64_t{1} << 60}}, kShape, "policies[2].params"); });
  EXPECT_NE(big.find("policies[2].params.sinks: policy 'sinks' expects an int within +-2^53"), std::string::npos) << big;
  // Huge but finite token budgets saturate instead of overflowing (they keep every token); as
  // ratios (the default units) anything above 1 is refused (issue 13, below).
  EXPECT_NE(r.create("h2o", {{"heavy", 1e300}, {"recent", 1e300}, {"units", std::string("tokens")}}, kShape),
            nullptr);
  EXPECT_NE(error_of([&] { r.create("h2o", {{"heavy", 1e300}, {"recent", 1e300}}, kShape); })
                .find("a ratio must be in [0, 1]"),
            std::string::npos);
}

// Issue 13: `heavy: 64` without `units` was silently a ratio of 6400%. One error naming the
// policy, the parameter, the accepted range and the fix; 1 (everything) is still a ratio.
TEST(PolicyParams, RatioAboveOneIsRefusedSuggestingTokens) {
  PolicyRegistry r = make_builtin_registry();
  for (const char* key : {"heavy", "recent"}) {
    const std::string e = error_of([&] { r.create("h2o", {{key, int64_t(64)}}, kShape, "policies[3].params"); });
    EXPECT_NE(e.find(std::string("policies[3].params: policy 'h2o': ") + key +
                     " = 64 with units: ratio (the default): a ratio must be in [0, 1]"),
              std::string::npos) << e;
    EXPECT_NE(e.find("set units: tokens"), std::string::npos) << e;
  }
  EXPECT_NE(r.create("h2o", {{"heavy", 1.0}, {"recent", 1.0}}, kShape), nullptr);
  EXPECT_NE(r.create("h2o", {{"heavy", int64_t(64)}, {"recent", int64_t(64)}, {"units", std::string("tokens")}}, kShape),
            nullptr);
}

// A value past int64 is named as such (not as "a float"); an int within int64 but past 2^53 is
// refused naming the bound.
TEST(PolicyParams, PastInt64IsNamed) {
  PolicyRegistry r = make_builtin_registry();
  std::string e = error_of([&] {
    r.create("sinks", {{"recent", parse_param_text("9223372036854775808")}}, kShape, "p");
  });
  EXPECT_NE(e.find("p.recent: policy 'sinks' expects int (decimal digits with an optional sign, at most "
                   "2^53 in magnitude, e.g. 256), got 9.22337e+18 (past int64)"),
            std::string::npos) << e;
  e = error_of([&] { r.create("sinks", {{"recent", parse_param_text("1e3")}}, kShape, "p"); });
  EXPECT_NE(e.find("got 1000 (a float)"), std::string::npos) << e;
}
}  // namespace
}  // namespace kvlab
