// Shared option parsing for the subcommands (Boost.Program_options).
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace kvlab::cli {

namespace po = boost::program_options;

// Parses `args` (args[0] = "kvlab NAME") against `desc` and the positional spec. Adds -h/--help.
// Returns false after printing usage (`usage_line` then the options) when --help was given;
// the caller then returns 0. Throws kvlab::Error naming the option on bad or missing arguments.
bool parse_options(const std::vector<std::string>& args, const std::string& usage_line,
                   po::options_description& desc, const po::positional_options_description& pos,
                   po::variables_map& vm);

// The whole file named by an option, as bytes; throws "PATH: cannot open the WHAT" (what = "text
// file", "haystack file") when it cannot be opened.
std::string read_input_file(const std::string& path, const std::string& what);

}  // namespace kvlab::cli
