// main() of kvlab's small helper programs (policy_trace, quest_reference_dump,
// kvlab_kept_positions): run(argc, argv); an exception is printed as "NAME: message" on stderr
// and the program exits 1.
#pragma once

#include <cstdio>
#include <exception>

namespace kvlab {

inline int tool_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace kvlab
