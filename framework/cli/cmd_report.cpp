// kvlab report OUT.h5: prints the summary tables of a results file.
#include <iostream>

#include "framework/cli/options.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"

namespace kvlab::cli {

int run_report(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string path;
  desc.add_options()("results", po::value(&path)->required(), "a results file written by kvlab run");
  po::positional_options_description pos;
  pos.add("results", 1);
  po::variables_map vm;
  if (!parse_options(args, "kvlab report OUT.h5", desc, pos, vm)) return 0;
  print_report(ResultsFile::open(path), std::cout);
  return 0;
}

}  // namespace kvlab::cli
