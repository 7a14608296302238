// The HDF5 results reader behind `kvlab merge`, `kvlab run --resume` and `kvlab report`: the
// input is one results.h5. Opens it, reads every root/run attribute, every complete cell and the
// summaries, prints the report, re-parses the recorded experiment, merges it into a new file
// (both in the case directory) and deletes the incomplete cells as a resume does.
#include <H5Fpublic.h>
#include <H5Ipublic.h>
#include <H5public.h>

#include <cstdio>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/merge.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvlab;
  const std::filesystem::path dir = fuzz::case_dir();
  const std::filesystem::path path = dir / "results.h5";
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  try {
    ResultsFile file = ResultsFile::open(path);
    (void)file.root_attrs();
    for (const std::string& run : file.runs()) {
      (void)file.run_attrs(run);
      for (const std::string& cell : file.complete_cells(run)) (void)file.read_cell(run, cell);
      for (const char* group : {"niah", "perplexity"}) {
        try {
          AttrMap attrs;
          (void)file.read_summary(run, group, &attrs);
        } catch (const Error&) {
        }
      }
    }
    std::ostringstream report;
    print_report(file, report);
    try {
      (void)experiment_of(file);
    } catch (const Error&) {
    }
    try {
      (void)merge_results(dir / "merged.h5", {path});
    } catch (const Error&) {
    }
    (void)file.delete_incomplete_cells();
  } catch (const Error&) {
  }
  // libhdf5 keeps freed blocks on its own free lists (H5FL) for reuse. Their state carried over
  // from one input to the next, and LeakSanitizer then reported blocks of those lists (24 + 4 x
  // 1152 bytes; 848 bytes in an earlier campaign) after inputs that replay clean alone. Emptying
  // the lists after each input makes an input's leaks its own. (Limiting the lists to 0 bytes
  // instead made every input's malloc and free counts differ, and each a full leak check: 15
  // instead of ~70-100 executions per second.)
  if (H5garbage_collect() < 0) std::abort();
  // Every HDF5 object an input opened must be closed by now. A 900-s campaign ended with a
  // LeakSanitizer report at exit (528 KB from libhdf5, H5C_create among it: a file that stayed
  // open) after libFuzzer had stopped checking each input for leaks; this check names the input.
  // (Datatypes are not counted: kvlab keeps its string types open for the process's lifetime.)
  constexpr unsigned kObjects = H5F_OBJ_FILE | H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_ATTR;
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, kObjects); open != 0) {
    std::fprintf(stderr, "fuzz_results: %zd HDF5 objects still open after the input:\n", open);
    std::vector<hid_t> ids(static_cast<size_t>(open));
    const ssize_t listed = H5Fget_obj_ids(H5F_OBJ_ALL, kObjects, ids.size(), ids.data());
    for (ssize_t i = 0; i < listed; ++i) {
      std::fprintf(stderr, "  HDF5 id type %d, reference count %d\n", static_cast<int>(H5Iget_type(ids[i])),
                   H5Iget_ref(ids[i]));
    }
    std::abort();
  }
  return 0;
}
