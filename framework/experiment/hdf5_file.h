// One HDF5 file, safely: the layer under the results file (results.cpp). Opening waits while
// another process holds the file; HDF5's exceptions become one kvlab::Error naming the file and
// the step; a change never writes the file in place (replace_file: an in-memory image, written
// to PATH.partial, fsynced and renamed over PATH); corrupt global heap collections are refused
// before libhdf5 reads them.
#pragma once

#include <H5Cpp.h>

#include <filesystem>
#include <functional>
#include <new>
#include <string>

#include "framework/core/error.h"

namespace kvlab::hdf5 {

// Opens `path` with H5F_ACC_* `flags`, waiting (up to 2 minutes) while another process holds
// its lock; any other failure is thrown at once.
H5::H5File open_file(const std::filesystem::path& path, unsigned flags);

// The system errors (errno) HDF5 recorded on its error stack, e.g. "No space left on device",
// "; "-joined and deduplicated ("" when none).
std::string hdf5_system_errors();

// Throws kvlab::Error: "PATH: HDF5 error while WHAT: detail (system errors)".
[[noreturn]] void fail_hdf5(const std::filesystem::path& path, const std::string& what, const H5::Exception& e);

// Runs `body`, turning HDF5's exceptions into kvlab::Error naming the file and what we did.
template <class F>
auto guarded(const std::filesystem::path& path, const std::string& what, F&& body) {
  H5::Exception::dontPrint();
  try {
    return body();
  } catch (const H5::Exception& e) {
    fail_hdf5(path, what, e);
  } catch (const std::bad_alloc&) {  // a size read from a corrupt file
    fail(path.string(), ": out of memory while ", what);
  }
}

// Writes a new version of `path` (an empty file when `create`) changed by `body`, atomically:
// on any error `path` is as it was and the error names it, `what` and the system error.
void replace_file(const std::filesystem::path& path, const std::string& what, bool create,
                  const std::function<void(H5::H5File&)>& body);

// Like replace_file, but `body(source, f)` builds the new version in an empty file `f` from
// `source`, the file as it is, opened read-only. For changes that drop part of a file that may
// be damaged (an interrupted cell): only what is kept is read. Unlinking the part in place
// instead made libhdf5 follow the dropped objects' damaged addresses while freeing their space,
// and the close that had to write those back failed and left the file open in the library
// (fuzz_results).
void rebuild_file(const std::filesystem::path& path, const std::string& what,
                  const std::function<void(const H5::H5File& source, H5::H5File& f)>& body);

}  // namespace kvlab::hdf5
