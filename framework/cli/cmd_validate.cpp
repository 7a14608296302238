// kvlab validate EXP.yaml: checks an experiment file without running anything.
#include <iostream>

#include "framework/cli/options.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/experiment.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab::cli {

int run_validate(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string experiment;
  desc.add_options()("experiment", po::value(&experiment)->required(), "the experiment YAML file")
      ("no-files", "do not check that the files it names exist");
  po::positional_options_description pos;
  pos.add("experiment", 1);
  po::variables_map vm;
  if (!parse_options(args, "kvlab validate EXP.yaml", desc, pos, vm)) return 0;
  const ExperimentSpec spec = parse_experiment(experiment);
  if (!vm.count("no-files")) check_files_exist(spec);
  PolicyRegistry registry = make_builtin_registry();
  for (const auto& p : spec.plugins) registry.load_plugin(p);
  check_policies(spec, PolicyLookup{[&](const std::string& t) { return registry.find(t); },
                                    [&] { return registry.names(); }});
  const auto runs = expand_runs(spec);
  const auto cells = expand_cells(spec, runs);
  std::cout << experiment << ": ok (" << runs.size() << " runs, " << cells.size() << " cells; output "
            << spec.output.string() << ")\n";
  return 0;
}

}  // namespace kvlab::cli
