#include "framework/experiment/params_yaml.h"

#include "framework/core/error.h"

namespace kvlab {

std::map<std::string, ParamValue> raw_params_from_yaml(const YAML::Node& node,
                                                       const std::string& context) {
  std::map<std::string, ParamValue> out;
  if (!node || node.IsNull()) return out;
  if (!node.IsMap()) fail(context, ": expected a mapping of policy parameters");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (!v.IsScalar())
      fail(context, ".", key, ": expected a scalar (number, bool or string)");
    // yaml-cpp tags quoted scalars "!": those stay strings ("3" is not a number).
    if (v.Tag() == "!")
      out[key] = v.Scalar();
    else
      out[key] = parse_param_text(v.Scalar());
  }
  return out;
}

}  // namespace kvlab
