// YAML experiment files: the input is one experiment YAML. Parses and validates it
// (parse_experiment_text, check_policies against the built-in registry), then expands the grid
// into runs and cells as `kvlab validate` does (plugins are not loaded: dlopen of a named file is
// not parsing). Files the YAML names are only looked up (std::filesystem::exists), never opened.
#include "framework/core/error.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/experiment.h"
#include "framework/policy/registry.h"
#include "fuzz/fuzz_util.h"
#include "policies/builtin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  static const PolicyRegistry registry = make_builtin_registry();
  const std::filesystem::path file = fuzz::case_dir() / "experiment.yaml";
  try {
    const ExperimentSpec spec =
        parse_experiment_text(std::string(reinterpret_cast<const char*>(data), size), file);
    check_policies(spec, PolicyLookup{[&](const std::string& t) { return registry.find(t); },
                                      [&] { return registry.names(); }});
    // Grids up to max_cells are valid; building a million cells per input would only slow the
    // fuzzer down (count_grid's arithmetic is tested on its own, ExperimentLimits.*).
    if (count_grid(spec).cells > 20000) return 0;
    const std::vector<RunSpec> runs = expand_runs(spec);
    const std::vector<CellSpec> cells = expand_cells(spec, runs);
    (void)cells.size();
  } catch (const Error&) {
  }
  return 0;
}
