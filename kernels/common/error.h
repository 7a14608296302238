// kvlab::Error and the few checking helpers the whole project shares.
//
// Contract: code at a boundary (model files, tokenizer files, YAML, HDF5, dlopen) throws
// kvlab::Error whose message names the file, key path or line and what was expected. `main`
// catches it, prints one line and exits non-zero. Library code never calls exit().
// Expected outcomes (out of KV blocks, ...) are values, not exceptions.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvlab {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates its arguments with operator<< into one string.
template <class... Parts>
std::string str_cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// Throws kvlab::Error with the concatenated message.
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(str_cat(std::forward<Parts>(parts)...));
}

}  // namespace kvlab

// Internal invariant (a bug in kvlab if it fires, not a user error). Throws, never aborts, so a
// long sweep still closes its results file cleanly.
#define KVLAB_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::kvlab::fail("internal error at ", __FILE__, ":", __LINE__, ": check `", #cond,      \
                    "` failed. ", ##__VA_ARGS__);                                           \
  } while (0)
