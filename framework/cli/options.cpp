#include "framework/cli/options.h"

#include <iostream>

#include "framework/core/error.h"

namespace kvlab::cli {

bool parse_options(const std::vector<std::string>& args, const std::string& usage_line,
                   po::options_description& desc, const po::positional_options_description& pos,
                   po::variables_map& vm) {
  desc.add_options()("help,h", "show this help");
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    po::store(po::command_line_parser(rest).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage_line << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    fail(e.what(), " (see ", args[0], " --help)");
  }
  return true;
}

}  // namespace kvlab::cli
