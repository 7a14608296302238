// Typed access to the YAML of an experiment file, shared by the experiment parser and every
// evaluation's own section parser (evals/evaluation.h): every error is a kvlab::Error
//     FILE:LINE:COL: KEY.PATH: what was expected, got what (did you mean 'nearest_key'?)
// Unknown keys are errors with the nearest valid key suggested (nearest_name).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/strings.h"
#include "kernels/common/enum_names.h"
#include "framework/policy/params.h"

namespace kvlab {

// Where a value came from, for error messages after parsing (registry checks, missing files).
struct SourceRef {
  std::string file;
  int line = 0;          // 1-based; 0 = unknown
  int column = 0;        // 1-based
  std::string key_path;  // "policies[2].params.budget"
  std::string str() const;  // "file:line:col: key.path"
};

// Typed access to a YAML tree that names file, line, column and key path in every error.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  SourceRef ref(const YAML::Node& node, const std::string& path) const {
    SourceRef r{file_, 0, 0, path};
    if (node.IsDefined() && node.Mark().line >= 0) {
      r.line = node.Mark().line + 1;
      r.column = node.Mark().column + 1;
    }
    return r;
  }

  template <class... Parts>
  [[noreturn]] void error(const YAML::Node& node, const std::string& path, Parts&&... parts) const {
    fail(ref(node, path).str(), ": ", std::forward<Parts>(parts)...);
  }

  static std::string describe(const YAML::Node& node) {
    if (node.IsNull()) return "nothing";
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a mapping";
    return "'" + node.Scalar() + "'";
  }

  // Checks that `node` is a mapping whose keys are all in `allowed` (no duplicates) and that
  // every key of `required` is present.
  void expect_map(const YAML::Node& node, const std::string& path,
                  const std::vector<std::string>& allowed,
                  const std::vector<std::string>& required = {}) const {
    if (!node.IsMap())
      error(node, path, "expected a mapping with keys ", join(allowed), ", got ", describe(node));
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        const std::string near = nearest_name(key, allowed);
        if (!near.empty())
          error(it->first, key_path, "unknown key '", key, "' (did you mean '", near, "'?)");
        error(it->first, key_path, "unknown key '", key, "'; expected one of ", join(allowed));
      }
      if (!seen.insert(key).second) error(it->first, key_path, "duplicate key '", key, "'");
    }
    for (const auto& key : required)
      if (!node[key])
        error(node, path, "missing required key '", key, "'");
  }

  std::string get_string(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) error(node, path, "expected a string, got ", describe(node));
    return node.Scalar();
  }

  int64_t get_int(const YAML::Node& node, const std::string& path, int64_t min, int64_t max) const {
    if (!node.IsScalar()) error(node, path, "expected an integer, got ", describe(node));
    const std::string& s = node.Scalar();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0)
      error(node, path, "expected an integer, got '", s, "'");
    if (v < min || v > max)
      error(node, path, "expected an integer in [", min, ", ", max, "], got ", v);
    return v;
  }

  double get_number(const YAML::Node& node, const std::string& path, double min, double max) const {
    if (!node.IsScalar()) error(node, path, "expected a number, got ", describe(node));
    const std::string& s = node.Scalar();
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
      error(node, path, "expected a number, got '", s, "'");
    if (v < min || v > max) error(node, path, "expected a number in [", min, ", ", max, "], got ", v);
    return v;
  }

  bool get_bool(const YAML::Node& node, const std::string& path) const {
    if (node.IsScalar()) {
      const std::string& s = node.Scalar();
      if (s == "true" || s == "True" || s == "yes") return true;
      if (s == "false" || s == "False" || s == "no") return false;
    }
    error(node, path, "expected true or false, got ", describe(node));
  }

  std::string get_choice(const YAML::Node& node, const std::string& path,
                         const std::vector<std::string>& choices) const {
    const std::string s = get_string(node, path);
    if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
    const std::string near = nearest_name(s, choices);
    error(node, path, "expected one of ", join(choices, " | "), ", got '", s, "'",
          near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  // get_choice over an enum's names (kernels/common/enum_names.h), returning the value.
  template <class E, size_t N>
  E get_enum(const YAML::Node& node, const std::string& path, const EnumName<E> (&names)[N]) const {
    return *enum_from_name(names, get_choice(node, path, enum_names(names)));
  }

  // A scalar or a list of scalars -> list of nodes with their paths.
  std::vector<std::pair<YAML::Node, std::string>> one_or_list(const YAML::Node& node,
                                                              const std::string& path) const {
    std::vector<std::pair<YAML::Node, std::string>> out;
    if (node.IsSequence()) {
      if (node.size() == 0) error(node, path, "expected a non-empty list");
      for (size_t i = 0; i < node.size(); ++i)
        out.emplace_back(node[i], str_cat(path, "[", i, "]"));
    } else if (node.IsScalar()) {
      out.emplace_back(node, path);
    } else {
      error(node, path, "expected a value or a list of values, got ", describe(node));
    }
    return out;
  }

  // A scalar as a policy parameter: quoted scalars stay strings, plain ones are typed.
  ParamValue get_param(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar())
      error(node, path, "expected a number, true/false or a string, got ", describe(node));
    if (node.Tag() == "!") return node.Scalar();  // quoted
    return parse_param_text(node.Scalar());
  }

  static std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
    std::string out;
    for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
    return out;
  }

 private:
  std::string file_;
};

// A relative path as written in the YAML: the current directory's when it exists there, else
// the one beside the YAML file, else as written (check_files_exist names it).
std::filesystem::path resolve_path(const std::string& text, const std::filesystem::path& yaml_file);
// A path or a list of paths, each resolved.
std::vector<std::filesystem::path> read_paths(const Reader& r, const YAML::Node& node, const std::string& path,
                                              const std::filesystem::path& yaml_file);
// The whole file as bytes; throws "PATH: cannot read".
std::string read_text_file(const std::filesystem::path& path);

}  // namespace kvlab
