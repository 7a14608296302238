// Command-line selection of an attention policy, shared by `kvlab generate`, `kvlab perplexity`
// and any other command that runs the engine:
//
//   --policy NAME                 a registered policy (default: full)
//   --policy-param KEY=VALUE      repeatable; typed as in params.h (parse_param_text)
//   --plugin PATH                 repeatable; loads a policy plugin first (plugin.h)
//
// Usage in a command:
//   add_policy_options(desc);  ... parse ...
//   PolicyRegistry registry = make_builtin_registry();          // policies/builtin.h
//   auto make = make_policy_maker_from_options(vm, registry, shape);  // validates now
//   engine.start_sequence(make());                               // one policy per sequence
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/policy/registry.h"

namespace kvlab {

void add_policy_options(boost::program_options::options_description& desc);

struct PolicyChoice {
  std::string name = "full";
  std::map<std::string, ParamValue> params;  // raw, not yet validated
  std::vector<std::string> plugins;
};
// Reads the three options; a --policy-param without '=' throws naming the option.
PolicyChoice policy_choice_from_options(const boost::program_options::variables_map& vm);

using PolicyMaker = std::function<std::unique_ptr<AttentionPolicy>()>;
// Loads the plugins into `registry`, validates the parameters (errors name the policy and
// "--policy-param.KEY") and returns a maker of fresh per-sequence policies. `registry` must
// outlive the maker.
PolicyMaker make_policy_maker(const PolicyChoice& choice, PolicyRegistry& registry,
                              const PolicyModelShape& shape);
PolicyMaker make_policy_maker_from_options(const boost::program_options::variables_map& vm,
                                           PolicyRegistry& registry,
                                           const PolicyModelShape& shape);
// One policy object (for single-sequence commands).
std::unique_ptr<AttentionPolicy> make_policy_from_options(
    const boost::program_options::variables_map& vm, PolicyRegistry& registry,
    const PolicyModelShape& shape);

}  // namespace kvlab
