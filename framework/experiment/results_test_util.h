// Shared by results_test.cpp and results_corrupt_test.cpp: a per-process temporary path, a cell
// with every dataset kind, the file's bytes, and the refused-root-attributes check.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

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

}  // namespace kvlab::results_testing
