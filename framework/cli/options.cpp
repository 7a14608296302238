#include "framework/cli/options.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "framework/core/error.h"
#include "framework/core/strings.h"

namespace kvlab::cli {

std::string read_input_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the ", what);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool parse_options(const std::vector<std::string>& args, const std::string& usage_line,
                   po::options_description& desc, const std::vector<Positional>& positional,
                   po::variables_map& vm) {
  desc.add_options()("help,h", "show this help");
  po::positional_options_description pos;
  for (const Positional& p : positional) pos.add(p.option, p.max_count);
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    // No abbreviations: Boost's default style takes "--out" for "--output"; a misspelt option
    // must be an error (with the nearest name), not silently another option.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::command_line_parser(rest).options(desc).positional(pos).style(style).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage_line << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    // "--threds" -> "did you mean '--threads'?" (the nearest long option of this command).
    std::string given = e.get_option_name();
    const std::string bare = given.substr(given.find_first_not_of('-'));
    std::vector<std::string> names;
    for (const auto& o : desc.options()) names.push_back(o->long_name());
    const std::string near = nearest_name(bare, names);
    fail("unknown option '", given, "'", near.empty() ? "" : " (did you mean '--" + near + "'?)", " (see ",
         args[0], " --help)");
  } catch (const po::required_option& e) {
    // A required positional argument reads as "the option '--experiment' is required": name it
    // as the usage line does.
    const std::string name = e.get_option_name();
    const std::string bare = name.substr(name.find_first_not_of('-'));
    for (unsigned i = 0; i < pos.max_total_count() && i < 8; ++i)
      if (pos.name_for_position(i) == bare)
        fail("missing ", bare, " argument; usage: ", usage_line, " (see ", args[0], " --help)");
    fail(e.what(), " (see ", args[0], " --help)");
  } catch (const po::error& e) {
    fail(e.what(), " (see ", args[0], " --help)");
  }
  return true;
}

}  // namespace kvlab::cli
