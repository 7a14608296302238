// safetensors reader (memory-mapped).
//
// Layout: u64 header_bytes (little-endian) | JSON header of header_bytes bytes |
//         data. The header maps each tensor name to {"dtype": "F32"|"F16"|"BF16"|...,
//         "shape": [d0, d1, ...] (row-major), "data_offsets": [begin, end]} (relative to the data
//         start); the optional "__metadata__" entry maps strings to strings.
// Contract: open() checks the header length, the JSON, every entry's dtype (F32, F16 and BF16
// only), that end - begin == elements * element size, and that the bytes lie within the file;
// errors throw kvlab::Error "<path>: <problem>" naming the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "framework/model/mapped_file.h"

namespace kvlab {

struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // row-major
  const void* data;            // into the map
  size_t n_bytes;
};

class SafetensorsFile {  // movable; keeps the file mapped
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return map_.path(); }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile map_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kvlab
