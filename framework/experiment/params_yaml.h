// Raw policy parameters from a YAML mapping (experiment files), for validate_params().
//
//   params: { budget: 0.2, units: ratio, keep_sinks: true }
//
// A plain scalar is typed like --policy-param text (parse_param_text: int, float, bool, else
// string); a quoted scalar is always a string. A non-mapping node, or a value that is a
// sequence or mapping, throws kvlab::Error naming `context.key`. Null/absent node: no params.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>

#include "framework/policy/params.h"

namespace kvlab {

std::map<std::string, ParamValue> raw_params_from_yaml(const YAML::Node& node,
                                                       const std::string& context);

}  // namespace kvlab
