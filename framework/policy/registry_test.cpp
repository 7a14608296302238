// Registry, parameter validation (map, YAML, CLI) and plugin-loader error reporting.
#include "framework/policy/registry.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>

#include "framework/core/error.h"
#include "framework/policy/cli_policy.h"
#include "framework/policy/params_yaml.h"
#include "framework/policy/plugin.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const PolicyModelShape kShape{2, 4, 2, 8, 512};

TEST(PolicyRegistry, HoldsTheSixBuiltins) {
  PolicyRegistry r = make_builtin_registry();
  EXPECT_EQ(r.names(), (std::vector<std::string>{"full", "h2o", "landmark", "sinks",
                                                  "sliding_window", "strided"}));
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

TEST(PolicyPlugin, VersionMismatchNamesBothVersions) {
  PolicyRegistry r;
  const std::string e = error_of([&] { r.load_plugin(KVLAB_TEST_PLUGIN_BADVER); });
  EXPECT_NE(e.find(KVLAB_TEST_PLUGIN_BADVER), std::string::npos) << e;
  EXPECT_NE(e.find("API version " + std::to_string(kKvlabPolicyApiVersion + 998)), std::string::npos) << e;
  EXPECT_NE(e.find("API version " + std::to_string(kKvlabPolicyApiVersion) + ";"), std::string::npos) << e;
  EXPECT_TRUE(r.names().empty());
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
  // Huge but finite budgets saturate instead of overflowing (they keep every token).
  EXPECT_NE(r.create("h2o", {{"heavy", 1e300}, {"recent", 1e300}}, kShape), nullptr);
  EXPECT_NE(r.create("h2o", {{"heavy", 1e300}, {"recent", 1e300}, {"units", std::string("tokens")}}, kShape),
            nullptr);
}
}  // namespace
}  // namespace kvlab
