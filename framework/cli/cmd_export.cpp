// kvlab export --format kvpress RESULTS.h5 DIR: a results file's RULER cells in kvpress's
// evaluation layout (framework/experiment/summary_rows.h export_kvpress).
#include <iostream>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/experiment/results.h"
#include "framework/experiment/summary_rows.h"

namespace kvlab::cli {

int run_export(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string format, results, dir;
  desc.add_options()("format", po::value(&format)->required(), "kvpress (the only format)")
      ("results", po::value(&results)->required(), "a results file written by kvlab run")
      ("dir", po::value(&dir)->required(), "where the per-configuration directories go");
  po::variables_map vm;
  if (!parse_options(args, "kvlab export --format kvpress RESULTS.h5 DIR", desc, {{"results", 1}, {"dir", 1}}, vm))
    return 0;
  if (format != "kvpress") fail("--format: expected kvpress, got '", format, "'");
  const auto written = export_kvpress(ResultsFile::open(results), dir);
  if (written.empty()) fail(results, ": no RULER cells to export");
  for (const auto& d : written) std::cout << d.string() << "\n";
  std::cout << "exported " << written.size() << " configurations to " << dir << "\n";
  return 0;
}

}  // namespace kvlab::cli
