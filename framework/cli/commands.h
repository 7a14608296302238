// The kvlab subcommands. Each lives in its own cmd_<name>.cpp, parses its own options with
// Boost.Program_options (so `kvlab NAME --help` works) and returns the process exit status.
// kvlab::Error escaping a command is caught in main.cpp, printed as one line, exit status 1.
#pragma once

#include <string>
#include <vector>

namespace kvlab::cli {

// args[0] is "kvlab NAME"; the rest are the command's own arguments.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* summary;  // one line for `kvlab --help`
  CommandFn run;
};

// Parses `args` with `desc` (+ positional), prints help and returns true when --help was given.
// Throws kvlab::Error with Boost's message (naming the option) on bad arguments.
}  // namespace kvlab::cli
