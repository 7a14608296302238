#include "framework/model/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"

namespace kvlab {

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  using nlohmann::json;
  SafetensorsFile file;
  file.map_ = MappedFile::open(path);
  const std::string p = path.string();
  const size_t size = file.map_.size();
  if (size < 8) fail(p, ": truncated: ", size, " bytes, too short for a safetensors header");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.map_.data(), 8);
  if (header_bytes > size - 8) {
    fail(p, ": truncated or not a safetensors file: header length ", header_bytes, " exceeds the ",
         size - 8, " bytes after it");
  }
  const char* header = reinterpret_cast<const char*>(file.map_.data() + 8);
  json j;
  try {
    j = json::parse(header, header + header_bytes);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    fail(p, ": not a safetensors file: header is not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(p, ": safetensors header is not a JSON object");
  const size_t data_start = 8 + header_bytes;
  const size_t data_bytes = size - data_start;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (entry.is_object()) {
        for (const auto& [k, v] : entry.items()) {
          if (v.is_string()) file.metadata_[k] = v.get<std::string>();
        }
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      fail(p, ": ", what, ": expected an object with dtype, shape and data_offsets");
    }
    SafetensorsTensor t;
    t.name = name;
    const json& dt = entry["dtype"];
    const std::string dtype = dt.is_string() ? dt.get<std::string>() : dt.dump();
    if (dtype == "F32") t.dtype = DType::kF32;
    else if (dtype == "F16") t.dtype = DType::kF16;
    else if (dtype == "BF16") t.dtype = DType::kBF16;
    else fail(p, ": ", what, ": unsupported dtype ", dtype, " (supported: F32, F16, BF16)");
    int64_t n_elements = 1;
    const json& shape = entry["shape"];
    if (!shape.is_array()) fail(p, ": ", what, ": shape is not an array");
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
        fail(p, ": ", what, ": bad shape ", shape.dump());
      }
      t.shape.push_back(d.get<int64_t>());
      // Checked before multiplying: each dimension is at most 2^40, the product at most 2^50.
      if (t.shape.back() > 0 && n_elements > (int64_t{1} << 50) / t.shape.back())
        fail(p, ": ", what, ": bad shape ", shape.dump());
      n_elements *= t.shape.back();
    }
    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      fail(p, ": ", what, ": data_offsets must be [begin, end], got ", off.dump());
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    t.n_bytes = dtype_bytes(t.dtype, n_elements);
    if (end < begin || end - begin != t.n_bytes) {
      fail(p, ": ", what, ": data_offsets [", begin, ", ", end, ") hold ", end - begin,
           " bytes but shape ", shape.dump(), " of ", dtype, " needs ", t.n_bytes);
    }
    if (end > data_bytes) {
      fail(p, ": truncated: ", what, " needs data bytes [", begin, ", ", end, ") but the file has only ",
           data_bytes, " bytes of data");
    }
    t.data = file.map_.data() + data_start + begin;
    file.tensors_.push_back(std::move(t));
  }
  return file;
}

}  // namespace kvlab
