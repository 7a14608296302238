// What the libFuzzer targets share (fuzz/README.md explains the targets and the campaign).
//
// Each target turns one input into files under a private temporary directory and runs the loader
// on them. Contract every target checks: a loader either succeeds or throws kvlab::Error; any
// other exception, a crash, a sanitizer report, a leak, a hang or an allocation over the fuzzer's
// limit is a finding. Targets are deterministic (no clock, no randomness, no threads that race)
// and write nowhere but case_dir().
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::fuzz {

// The process's temporary directory (mkdtemp under $TMPDIR or /tmp), removed at exit.
inline const std::filesystem::path& temp_root() {
  struct Root {
    std::filesystem::path path;
    Root() {
      const char* tmp = std::getenv("TMPDIR");
      std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvlab-fuzz-XXXXXX";
      if (mkdtemp(templ.data()) == nullptr) std::abort();
      path = templ;
    }
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

// An empty directory for the current input (the previous input's files are removed, so no input
// sees another's files).
inline std::filesystem::path case_dir() {
  const std::filesystem::path dir = temp_root() / "case";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();  // the temp dir is ours: a failed write is the harness's bug
}

// Targets whose input is several files separate them with this line (the seed generator
// fuzz/make_corpus.py and the dictionaries use the same separator).
inline constexpr std::string_view kPartSeparator = "\n=====kvlab-fuzz-part=====\n";

// Splits `data` at kPartSeparator into at most `max_parts` parts (the last part keeps any
// further separators).
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
  std::vector<std::string_view> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < max_parts) {
    const size_t at = rest.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(rest);
  return parts;
}

}  // namespace kvlab::fuzz
