// kvlab validate EXP.yaml: checks an experiment file without running anything: the YAML, the
// files it names, every policy grid point against the registry (plugins loaded), and, with the
// model's header, everything the model decides (context lengths, windows, probe layers;
// runner.h check_experiment_against_model). Settings that run but measure nothing are warned.
#include <iostream>

#include "framework/cli/options.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/experiment.h"
#include "framework/experiment/runner.h"
#include "framework/model/model.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab::cli {

int run_validate(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string experiment;
  desc.add_options()("experiment", po::value(&experiment)->required(), "the experiment YAML file")
      ("no-files", "do not check that the files it names exist (nor the model-dependent settings)");
  po::variables_map vm;
  if (!parse_options(args, "kvlab validate EXP.yaml [--no-files]", desc, {{"experiment", 1}}, vm)) return 0;
  const ExperimentSpec spec = parse_experiment(experiment);
  const bool files = !vm.count("no-files");
  if (files) check_files_exist(spec);
  PolicyRegistry registry = make_builtin_registry();
  for (const auto& p : spec.plugins) registry.load_plugin(p);
  check_policies(spec, PolicyLookup{[&](const std::string& t) { return registry.find(t); },
                                    [&] { return registry.names(); }});
  std::string model_note = " (model not checked: --no-files)";
  if (files) {
    LoadOptions load;
    load.weight_dtype = "keep";  // the header is enough: no conversion
    load.load_tokenizer = false;
    const std::unique_ptr<Model> model = load_model(spec.model.path, load);
    for (const std::string& w : check_experiment_against_model(spec, model->config, registry))
      std::cerr << "warning: " << w << "\n";
    model_note = " (checked against " + spec.model.path.filename().string() + ": context " +
                 std::to_string(model->config.max_seq_len) + " tokens)";
  }
  const auto runs = expand_runs(spec);
  const auto cells = expand_cells(spec, runs);
  std::cout << experiment << ": ok (" << runs.size() << " runs, " << cells.size() << " cells; output "
            << spec.output.string() << ")" << model_note << "\n";
  return 0;
}

}  // namespace kvlab::cli
