// GGUF reader (versions 2 and 3, little-endian). The file stays memory-mapped while the GgufFile
// is alive; tensor data pointers point into the map.
//
// File layout (all integers little-endian):
//   u32 magic "GGUF" | u32 version (2 or 3) | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 value type | value }
//       string = u64 length + bytes (no NUL); array = u32 element type + u64 count + elements
//       (arrays may nest: an element type of ARRAY holds arrays)
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset }
//   padding to `general.alignment` (u32, default 32)
//   tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
// ne[0] is the contiguous dimension: a row-major [rows, cols] matrix has ne = {cols, rows}.
//
// Contract: open() validates everything it reads (bounds, counts, duplicate keys and names,
// alignment, tensor extents within the file) and throws kvlab::Error "<path>: <problem>" on the
// first violation. Tensors of other ggml types (IQ4_NL, ...) are listed with supported() == false
// and n_bytes == 0 (their extent is not checked), so that the metadata and tokenizer of such a
// file can still be read; load_model refuses them, naming the tensor and its type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "framework/model/mapped_file.h"

namespace kvlab {

enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12
};
enum class GgmlType : uint32_t {  // the ggml tensor types kvlab runs (others are rejected)
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

const char* gguf_type_name(GgufType type);    // "UINT8", ..., "FLOAT64"
std::string ggml_type_name(uint32_t type);    // "F32", "Q4_0", ... or "type 123"
// Bytes of a tensor of `type` holding `n_elements` (Q8_0: 34 bytes per block of 32; the block
// types: kernels/cpu/quant_blocks.h); 0 for a type kvlab does not run.
size_t ggml_tensor_bytes(GgmlType type, int64_t n_elements);
// Values per block (1 for F32/F16/BF16, 32 or 256); 0 for a type kvlab does not run.
int64_t ggml_block_values(GgmlType type);
// "F32, F16, BF16, Q8_0, Q4_0, ..." : the types supported() accepts, for error messages.
const char* ggml_supported_types();

// One metadata value (scalar, array of scalars, or array of arrays). Knows its key and file so
// that type errors name both: "<path>: key 'llama.block_count': expected an integer, got STRING".
class GgufValue {
 public:
  const std::string& key() const { return key_; }
  GgufType type() const { return type_; }
  GgufType array_type() const;   // element type; throws when not an array
  size_t array_size() const;     // element count; throws when not an array

  int64_t as_int() const;        // any integer type or bool; else throws naming file + key
  double as_float() const;       // any numeric type (integers and bool included)
  bool as_bool() const;          // BOOL only
  const std::string& as_string() const;          // STRING only
  std::vector<std::string> as_strings() const;   // array of strings
  std::vector<float> as_floats() const;          // array of numbers
  std::vector<int64_t> as_ints() const;          // array of integers (or bools)
  const std::vector<GgufValue>& as_arrays() const;  // array of arrays (elements keyed "key[i]")

  // Short human-readable form: scalars in full, arrays as "[a, b, c, ... (N items)]".
  std::string to_string(size_t max_items = 8) const;

 private:
  friend class GgufParser;
  [[noreturn]] void type_error(const char* expected) const;
  bool is_integer() const;

  std::shared_ptr<const std::filesystem::path> file_;
  std::string key_;
  GgufType type_ = GgufType::kUint8;
  GgufType elem_type_ = GgufType::kUint8;  // arrays only
  // Scalars: integers in int_ (u64 above INT64_MAX sets big_unsigned_), floats in float_.
  int64_t int_ = 0;
  bool big_unsigned_ = false;
  double float_ = 0;
  std::string str_;
  // Arrays: exactly one of these holds the elements, by element type.
  std::vector<int64_t> ints_;       // integer and bool elements (u64 stored bit-cast)
  std::vector<double> floats_;      // FLOAT32 / FLOAT64 elements
  std::vector<std::string> strs_;   // STRING elements
  std::vector<GgufValue> items_;    // ARRAY elements
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] contiguous
  GgmlType type;             // may hold a ggml type id outside the enum: see supported()
  uint64_t offset;          // from the start of the data section
  const void* data;         // into the map
  size_t n_bytes;           // 0 when !supported()
  bool supported() const;   // one of ggml_supported_types()
  int64_t n_elements() const;
};

class GgufFile {  // movable; keeps the file mmapped while alive
 public:
  static GgufFile open(const std::filesystem::path& path);  // throws Error naming path + problem
  const std::filesystem::path& path() const { return map_.path(); }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }  // start of the tensor data section

  const GgufValue* find(std::string_view key) const;   // nullptr when absent
  const GgufValue& at(std::string_view key) const;     // throws "<path>: missing key '<key>'"
  const std::vector<GgufValue>& metadata() const { return values_; }  // in file order

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  friend class GgufParser;
  MappedFile map_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<GgufValue> values_;
  std::map<std::string, size_t, std::less<>> value_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvlab
