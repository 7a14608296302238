// Shared option parsing for the subcommands (Boost.Program_options).
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace kvlab::cli {

namespace po = boost::program_options;

// A positional argument: the option it fills and how many words it takes (-1: all the rest).
struct Positional {
  const char* option;
  int max_count;
};

// Parses `args` (args[0] = "kvlab NAME") against `desc` and the positional arguments in order.
// Adds -h/--help. Returns false after printing usage (`usage_line` then the options) when --help
// was given; the caller then returns 0. Throws kvlab::Error naming the option on bad or missing
// arguments.
bool parse_options(const std::vector<std::string>& args, const std::string& usage_line,
                   po::options_description& desc, const std::vector<Positional>& positional,
                   po::variables_map& vm);

// The whole file named by an option, as bytes; throws "PATH: cannot open the WHAT" (what = "text
// file", "haystack file") when it cannot be opened.
std::string read_input_file(const std::string& path, const std::string& what);

}  // namespace kvlab::cli
