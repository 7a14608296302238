// SHA-256 (FIPS 180-4), to fingerprint the model file a results file was produced with.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace kvlab {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> data);
  std::string hex_digest();  // 64 lowercase hex digits; finishes the hash

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// Hash of a file's bytes; for a directory (a Hugging Face model), of each regular file's
// relative name and bytes, in sorted order. Throws kvlab::Error naming the path.
std::string sha256_of_path(const std::filesystem::path& path);

}  // namespace kvlab
