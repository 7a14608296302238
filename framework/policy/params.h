// Typed, documented, validated policy parameters.
//
// A policy declares ParamSpecs (name, type, default, one-line doc, optional range or choices).
// Readers (YAML experiment files, the --policy-param CLI flag) turn raw text into ParamValue and
// call validate_params(), which rejects unknown keys (suggesting the nearest valid one), wrong
// types and out-of-range values with an Error naming the policy and key, and fills defaults.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvlab {

enum class ParamType { kBool, kInt, kFloat, kString };
using ParamValue = std::variant<bool, int64_t, double, std::string>;

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  ParamValue default_value;
  std::string doc;
  std::optional<double> min;          // inclusive bounds for kInt / kFloat
  std::optional<double> max;
  std::vector<std::string> choices;   // allowed values for kString (empty: any)
};
using ParamSpecs = std::vector<ParamSpec>;

// Validated parameters (every declared key present). Getters throw kvlab::Error naming the key
// on a type mismatch (a bug in the policy, not user input).
class ParamValues {
 public:
  ParamValues() = default;
  explicit ParamValues(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}
  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;  // an int value is accepted
  const std::string& get_string(const std::string& name) const;
  const std::map<std::string, ParamValue>& all() const { return values_; }

 private:
  const ParamValue& at(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

// `context` names where the values came from (e.g. "policies[2].params" or "--policy-param").
ParamValues validate_params(const std::string& policy_name, const ParamSpecs& specs,
                            const std::map<std::string, ParamValue>& raw,
                            const std::string& context);

// "3" -> int, "0.5" -> float, "true"/"false" -> bool, else string; then coerced by the spec type.
ParamValue parse_param_text(const std::string& text);
std::string to_string(const ParamValue& value);
const char* to_string(ParamType type);  // "bool" | "int" | "float" | "string"

}  // namespace kvlab
