// Shared by results_test.cpp and results_corrupt_test.cpp: a per-process temporary path, a cell
// with every dataset kind, the file's bytes, and the refused-root-attributes check.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/results.h"

namespace kvlab::results_testing {

namespace fs = std::filesystem;

inline fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvlab_results_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

inline CellRecord sample_cell() {
  CellRecord rec;
  rec.attrs["kind"] = std::string("niah");
  rec.attrs["context_length"] = int64_t(512);
  rec.attrs["prefill_s"] = 0.25;
  rec.attrs["recall_per_layer"] = std::vector<double>{0.5, 0.75};
  rec.attrs["positions"] = std::vector<int64_t>{1, 2, 3};
  Dataset correct;
  correct.data = std::vector<int8_t>{1, 0, 1, 1, 0, 0};
  correct.shape = {2, 3};
  rec.datasets["correct"] = correct;
  Dataset nll;
  nll.data = std::vector<float>(100000, 0.5f);  // larger than one chunk
  nll.attrs["unit"] = std::string("nats");
  rec.datasets["nll"] = nll;
  Dataset answers;
  answers.data = std::vector<std::string>{"1234567", "", "üñí"};
  rec.datasets["answers"] = answers;
  Dataset empty;
  empty.data = std::vector<int64_t>{};
  rec.datasets["empty"] = empty;
  Dataset dbl;
  dbl.data = std::vector<double>{-1.5, 2.25};
  rec.datasets["lp"] = dbl;
  return rec;
}

inline std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// Reading the root attributes of `path` must fail with an Error naming the file and holding
// `message`; `accepted` is the failure reported when they read.
inline void expect_root_attrs_refused(const fs::path& path, const std::string& message, const char* accepted) {
  try {
    (void)ResultsFile::open(path).root_attrs();
    ADD_FAILURE() << accepted;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path.string()), std::string::npos) << m;
    EXPECT_NE(m.find(message), std::string::npos) << m;
  }
}

// `read` (of `path`, corrupted) must throw an Error that names the object header it refuses
// ("PATH: the object header at byte ...") and holds `expected`.
inline void expect_object_header_refused(const fs::path& path, const std::function<void()>& read,
                                         const std::string& expected) {
  try {
    read();
    ADD_FAILURE() << "accepted: " << expected;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path.string() + ": the object header at byte "), std::string::npos) << m;
    EXPECT_NE(m.find(expected), std::string::npos) << m;
  }
}

// Writes a results file at `path` holding one complete cell (full/ppl_T0: sample_cell()), checks
// that it reads, and returns its bytes.
inline std::string sample_cell_file(const fs::path& path) {
  { ResultsFile::create(path, {}).write_cell("full", "ppl_T0", sample_cell()); }
  EXPECT_NO_THROW(ResultsFile::open(path).read_cell("full", "ppl_T0"));
  return file_bytes(path);
}

// Where the body of the first float32 datatype message of a file kvlab wrote starts (the 'nll'
// dataset's): {u16 type 3, u16 size, u8 flags, 3 reserved} {0x11: class 1 (float) version 1; 3
// bytes of bit field; u32 size 4, ...}. npos when there is none.
inline size_t first_float_datatype(const std::string& bytes) {
  for (size_t p = 0; p + 16 <= bytes.size(); ++p)
    if (bytes.compare(p, 2, "\x03\x00", 2) == 0 && bytes.compare(p + 5, 3, "\0\0\0", 3) == 0 && bytes[p + 8] == 0x11 &&
        bytes.compare(p + 12, 4, "\x04\0\0\0", 4) == 0)
      return p + 8;
  return std::string::npos;
}

// One byte of a file changed: at `at`, to `value`; `expected` is what the refusal must say.
struct ByteCorruption {
  size_t at;
  char value;
  std::string expected;
};

// Each {file contents, expected} is written to `path` in turn and `read` (of `path`) must refuse
// it naming the object header (expect_object_header_refused) with `expected`.
inline void expect_each_refused(const fs::path& path, const std::vector<std::pair<std::string, std::string>>& files,
                                const std::function<void()>& read) {
  for (const auto& [contents, expected] : files) {
    write_file_bytes(path, contents);
    expect_object_header_refused(path, read, expected);
  }
}

// The same for `bytes` with one byte changed per corruption.
inline void expect_byte_corruptions_refused(const fs::path& path, const std::string& bytes,
                                            const std::vector<ByteCorruption>& corruptions,
                                            const std::function<void()>& read) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const ByteCorruption& c : corruptions) {
    files.emplace_back(bytes, c.expected);
    files.back().first[c.at] = c.value;
  }
  expect_each_refused(path, files, read);
}

}  // namespace kvlab::results_testing
