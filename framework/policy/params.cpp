#include "framework/policy/params.h"

#include <algorithm>
#include <cerrno>
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

// Coerces `v` to the spec's type or returns nullopt. An int is a valid float; a float is never
// a valid int (1e3 or 256.0 for a count is refused, naming the form an int takes); floats must be
// finite (no parameter gives NaN or infinity a meaning, and both would reach integer conversions
// in the policies: heavy=inf).
std::optional<ParamValue> coerce(const ParamValue& v, ParamType t) {
  switch (t) {
    case ParamType::kBool:
      if (auto* b = std::get_if<bool>(&v)) return *b;
      return std::nullopt;
    case ParamType::kInt:
      if (auto* i = std::get_if<int64_t>(&v)) return *i;
      return std::nullopt;
    case ParamType::kFloat:
      if (auto* d = std::get_if<double>(&v); d && std::isfinite(*d)) return *d;
      if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
      return std::nullopt;
    case ParamType::kString:
      if (auto* s = std::get_if<std::string>(&v)) return *s;
      return std::nullopt;
  }
  return std::nullopt;
}

// The accepted spelling of each type, for error messages.
const char* accepted_form(ParamType t) {
  switch (t) {
    case ParamType::kBool: return "true or false";
    case ParamType::kInt: return "decimal digits with an optional sign, at most 2^53 in magnitude, e.g. 256";
    case ParamType::kFloat: return "a finite decimal number, e.g. 0.25 or 1e-3";
    case ParamType::kString: return "text";
  }
  return "?";
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
  // int: [+-]digits that fit int64. float: [+-]digits[.digits][(e|E)[+-]digits] (at least one
  // digit before the exponent), finite. Anything else stays text, so that a numeric parameter
  // refuses it by name: 0x10, nan, inf, 1e400, 1_000, " 5".
  const size_t n = text.size();
  const auto digits = [&](size_t& i) {
    const size_t start = i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  size_t i = 0;
  if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
  const size_t int_digits = digits(i);
  if (int_digits > 0 && i == n) {
    errno = 0;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno != ERANGE) return int64_t(v);
    // past int64: a float (an int parameter refuses it)
  } else {
    size_t frac_digits = 0;
    if (i < n && text[i] == '.') {
      ++i;
      frac_digits = digits(i);
    }
    if (int_digits + frac_digits == 0) return text;
    if (i < n && (text[i] == 'e' || text[i] == 'E')) {
      ++i;
      if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
      if (digits(i) == 0) return text;
    }
    if (i != n) return text;
  }
  const double d = std::strtod(text.c_str(), nullptr);
  if (!std::isfinite(d)) return text;
  return d;
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
    if (!coerced) {
      // What the value was taken for: a float (1e3, 1.5), or digits past int64 (which
      // parse_param_text keeps as a float so that a float parameter still takes them).
      const auto* d = std::get_if<double>(&value);
      const bool past_int64 = d && std::isfinite(*d) && std::floor(*d) == *d && std::fabs(*d) >= 0x1p63;
      fail(context, ".", key, ": policy '", policy_name, "' expects ", to_string(spec->type), " (",
           accepted_form(spec->type), "), got ", std::holds_alternative<std::string>(value) ? "'" : "",
           to_string(value), std::holds_alternative<std::string>(value) ? "'" : "",
           !d ? "" : past_int64 && spec->type == ParamType::kInt ? " (past int64)" : " (a float)");
    }
    // Ints stay within +-2^53: exact in the double range check below, and far from int64
    // overflow when a policy adds a few of them (sinks + recent + keep).
    constexpr int64_t kMaxInt = int64_t{1} << 53;
    if (auto* i = std::get_if<int64_t>(&*coerced); i && (*i > kMaxInt || *i < -kMaxInt))
      fail(context, ".", key, ": policy '", policy_name, "' expects an int within +-2^53, got ", *i);
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
