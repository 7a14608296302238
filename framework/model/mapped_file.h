// A read-only memory map of a whole file (POSIX mmap). Model weights stay in the map and are read
// in place; the map lives as long as the MappedFile (move-only).
//
// Contract: open() throws kvlab::Error naming the path and the OS error when the file cannot be
// opened or mapped. An empty file maps to an empty span (no error here: the format readers report
// "truncated" with their own context).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace kvlab {

class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(const std::filesystem::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::filesystem::path& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvlab
