// kvlab report OUT.h5: prints the summary tables of a results file.
#include <iostream>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"

namespace kvlab::cli {

int run_report(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string path;
  desc.add_options()("results", po::value(&path)->required(), "a results file written by kvlab run (a partial one too)")
      ("json", "print JSON: per run (setting, effective parameters, aggregates, per length) and every cell")
      ("csv", "print CSV: one row per complete cell");
  po::variables_map vm;
  if (!parse_options(args, "kvlab report OUT.h5 [--json | --csv]", desc, {{"results", 1}}, vm)) return 0;
  if (vm.count("json") && vm.count("csv")) fail("--json and --csv exclude each other");
  print_report(ResultsFile::open(path), std::cout,
               vm.count("json") ? ReportFormat::kJson : vm.count("csv") ? ReportFormat::kCsv : ReportFormat::kText);
  return 0;
}

}  // namespace kvlab::cli
