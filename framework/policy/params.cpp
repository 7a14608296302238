#include "framework/policy/params.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "framework/core/error.h"
#include "framework/core/strings.h"

namespace kvlab {

const char* to_string(ParamType t) {
  switch (t) {
    case ParamType::kBool: return "bool";
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kString: return "string";
  }
  return "?";
}

namespace {

// Coerces `v` to the spec's type or returns nullopt. An int is a valid float; a float with an
// integral value is a valid int.
std::optional<ParamValue> coerce(const ParamValue& v, ParamType t) {
  switch (t) {
    case ParamType::kBool:
      if (auto* b = std::get_if<bool>(&v)) return *b;
      return std::nullopt;
    case ParamType::kInt:
      if (auto* i = std::get_if<int64_t>(&v)) return *i;
      if (auto* d = std::get_if<double>(&v); d && std::floor(*d) == *d) return int64_t(*d);
      return std::nullopt;
    case ParamType::kFloat:
      if (auto* d = std::get_if<double>(&v)) return *d;
      if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
      return std::nullopt;
    case ParamType::kString:
      if (auto* s = std::get_if<std::string>(&v)) return *s;
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::string to_string(const ParamValue& value) {
  if (auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&value)) {
    std::ostringstream out;
    out << *d;
    return out.str();
  }
  return std::get<std::string>(value);
}

ParamValue parse_param_text(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  if (!text.empty()) {
    char* end = nullptr;
    const long long i = std::strtoll(text.c_str(), &end, 10);
    if (*end == '\0') return int64_t(i);
    const double d = std::strtod(text.c_str(), &end);
    if (*end == '\0') return d;
  }
  return text;
}

ParamValues validate_params(const std::string& policy_name, const ParamSpecs& specs,
                            const std::map<std::string, ParamValue>& raw,
                            const std::string& context) {
  std::map<std::string, ParamValue> out;
  for (const auto& [key, value] : raw) {
    // (an init-capture: clang 14 cannot capture a structured binding)
    auto spec = std::find_if(specs.begin(), specs.end(), [&name = key](auto& s) { return s.name == name; });
    if (spec == specs.end()) {
      std::string msg = str_cat(context, ".", key, ": unknown parameter of policy '", policy_name, "'");
      std::vector<std::string> names;
      for (const auto& s : specs) names.push_back(s.name);
      if (const std::string best = nearest_name(key, names); !best.empty())
        msg += str_cat(" (did you mean '", best, "'?)");
      std::string valid;
      for (const auto& s : specs) valid += (valid.empty() ? "" : ", ") + s.name;
      fail(msg, "; valid parameters: ", valid.empty() ? "none" : valid);
    }
    auto coerced = coerce(value, spec->type);
    if (!coerced)
      fail(context, ".", key, ": policy '", policy_name, "' expects ", to_string(spec->type),
           ", got '", to_string(value), "'");
    if (spec->type == ParamType::kInt || spec->type == ParamType::kFloat) {
      const double x = spec->type == ParamType::kInt ? double(std::get<int64_t>(*coerced))
                                                     : std::get<double>(*coerced);
      if ((spec->min && x < *spec->min) || (spec->max && x > *spec->max))
        fail(context, ".", key, ": policy '", policy_name, "' expects a value in [",
             spec->min ? to_string(*spec->min) : "-inf", ", ",
             spec->max ? to_string(*spec->max) : "inf", "], got ", to_string(*coerced));
    }
    if (spec->type == ParamType::kString && !spec->choices.empty() &&
        std::find(spec->choices.begin(), spec->choices.end(), std::get<std::string>(*coerced)) ==
            spec->choices.end()) {
      std::string valid;
      for (const auto& c : spec->choices) valid += (valid.empty() ? "" : " | ") + c;
      fail(context, ".", key, ": policy '", policy_name, "' expects one of ", valid, ", got '",
           std::get<std::string>(*coerced), "'");
    }
    out[key] = *coerced;
  }
  for (const auto& s : specs)
    if (!out.count(s.name)) out[s.name] = s.default_value;
  return ParamValues(std::move(out));
}

const ParamValue& ParamValues::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail("internal error: policy parameter '", name, "' was not declared");
  return it->second;
}
bool ParamValues::get_bool(const std::string& name) const {
  if (auto* b = std::get_if<bool>(&at(name))) return *b;
  fail("policy parameter '", name, "' is not a bool");
}
int64_t ParamValues::get_int(const std::string& name) const {
  if (auto* i = std::get_if<int64_t>(&at(name))) return *i;
  fail("policy parameter '", name, "' is not an int");
}
double ParamValues::get_float(const std::string& name) const {
  const ParamValue& v = at(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  fail("policy parameter '", name, "' is not a number");
}
const std::string& ParamValues::get_string(const std::string& name) const {
  if (auto* s = std::get_if<std::string>(&at(name))) return *s;
  fail("policy parameter '", name, "' is not a string");
}

}  // namespace kvlab
