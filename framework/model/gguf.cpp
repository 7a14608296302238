#include "framework/model/gguf.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "framework/core/error.h"

namespace kvlab {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;                   // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;             // nested arrays deeper than this are refused
constexpr int64_t kQ8Block = 32;

bool valid_gguf_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

// Size in bytes of one scalar of type `t` (0 for STRING and ARRAY).
size_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16: case GgufType::kInt16:
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kUint64: case GgufType::kInt64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}

bool is_float_type(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

}  // namespace

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8: return "UINT8";
    case GgufType::kInt8: return "INT8";
    case GgufType::kUint16: return "UINT16";
    case GgufType::kInt16: return "INT16";
    case GgufType::kUint32: return "UINT32";
    case GgufType::kInt32: return "INT32";
    case GgufType::kFloat32: return "FLOAT32";
    case GgufType::kBool: return "BOOL";
    case GgufType::kString: return "STRING";
    case GgufType::kArray: return "ARRAY";
    case GgufType::kUint64: return "UINT64";
    case GgufType::kInt64: return "INT64";
    case GgufType::kFloat64: return "FLOAT64";
  }
  return "UNKNOWN";
}

std::string ggml_type_name(uint32_t type) {
  // Names of the ggml tensor types, so that a rejected file says which type it holds.
  static const char* const kNames[] = {
      "F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
  if (type < std::size(kNames)) return kNames[type];
  return str_cat("type ", type);
}

namespace {
// {values per block, bytes per block} of the types kvlab runs (ggml-common.h's block structs).
std::pair<int64_t, size_t> block_shape(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return {1, 4};
    case GgmlType::kF16: case GgmlType::kBF16: return {1, 2};
    case GgmlType::kQ8_0: return {kQ8Block, 34};  // fp16 scale + 32 x int8
    case GgmlType::kQ4_0: return {32, 18};
    case GgmlType::kQ4_1: return {32, 20};
    case GgmlType::kQ5_0: return {32, 22};
    case GgmlType::kQ5_1: return {32, 24};
    case GgmlType::kQ2_K: return {256, 84};
    case GgmlType::kQ3_K: return {256, 110};
    case GgmlType::kQ4_K: return {256, 144};
    case GgmlType::kQ5_K: return {256, 176};
    case GgmlType::kQ6_K: return {256, 210};
  }
  return {0, 0};
}
}  // namespace

size_t ggml_tensor_bytes(GgmlType type, int64_t n_elements) {
  const auto [values, bytes] = block_shape(type);
  return values == 0 ? 0 : static_cast<size_t>(n_elements / values) * bytes;
}

int64_t ggml_block_values(GgmlType type) { return block_shape(type).first; }

const char* ggml_supported_types() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";
}

bool GgufTensorInfo::supported() const { return ggml_block_values(type) != 0; }

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// GgufValue accessors

void GgufValue::type_error(const char* expected) const {
  std::string got = gguf_type_name(type_);
  if (type_ == GgufType::kArray) got = str_cat("ARRAY of ", gguf_type_name(elem_type_));
  fail(file_ ? file_->string() : std::string("<gguf>"), ": key '", key_, "': expected ", expected,
       ", got ", got);
}

bool GgufValue::is_integer() const { return is_integer_type(type_); }

GgufType GgufValue::array_type() const {
  if (type_ != GgufType::kArray) type_error("an array");
  return elem_type_;
}

size_t GgufValue::array_size() const {
  if (type_ != GgufType::kArray) type_error("an array");
  switch (elem_type_) {
    case GgufType::kString: return strs_.size();
    case GgufType::kArray: return items_.size();
    case GgufType::kFloat32: case GgufType::kFloat64: return floats_.size();
    default: return ints_.size();
  }
}

int64_t GgufValue::as_int() const {
  if (!is_integer()) type_error("an integer");
  if (big_unsigned_) {
    fail(file_->string(), ": key '", key_, "': value ", static_cast<uint64_t>(int_),
         " does not fit in int64");
  }
  return int_;
}

double GgufValue::as_float() const {
  if (is_float_type(type_)) return float_;
  if (is_integer()) {
    return big_unsigned_ ? static_cast<double>(static_cast<uint64_t>(int_))
                         : static_cast<double>(int_);
  }
  type_error("a number");
}

bool GgufValue::as_bool() const {
  if (type_ != GgufType::kBool) type_error("a BOOL");
  return int_ != 0;
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufType::kString) type_error("a STRING");
  return str_;
}

std::vector<std::string> GgufValue::as_strings() const {
  if (type_ != GgufType::kArray || elem_type_ != GgufType::kString) type_error("an array of STRING");
  return strs_;
}

std::vector<float> GgufValue::as_floats() const {
  if (type_ != GgufType::kArray) type_error("an array of numbers");
  std::vector<float> out;
  if (is_float_type(elem_type_)) {
    out.assign(floats_.begin(), floats_.end());
  } else if (is_integer_type(elem_type_)) {
    out.reserve(ints_.size());
    for (int64_t v : ints_) {
      out.push_back(elem_type_ == GgufType::kUint64
                        ? static_cast<float>(static_cast<uint64_t>(v))
                        : static_cast<float>(v));
    }
  } else {
    type_error("an array of numbers");
  }
  return out;
}

std::vector<int64_t> GgufValue::as_ints() const {
  if (type_ != GgufType::kArray || !is_integer_type(elem_type_)) type_error("an array of integers");
  if (elem_type_ == GgufType::kUint64) {
    for (int64_t v : ints_) {
      if (v < 0) {
        fail(file_->string(), ": key '", key_, "': element ", static_cast<uint64_t>(v),
             " does not fit in int64");
      }
    }
  }
  return ints_;
}

const std::vector<GgufValue>& GgufValue::as_arrays() const {
  if (type_ != GgufType::kArray || elem_type_ != GgufType::kArray) type_error("an array of arrays");
  return items_;
}

std::string GgufValue::to_string(size_t max_items) const {
  std::ostringstream out;
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '\n') q += "\\n";
      else if (c == '"') q += "\\\"";
      else q += c;
    }
    return q + "\"";
  };
  switch (type_) {
    case GgufType::kString: return quoted(str_);
    case GgufType::kBool: return int_ ? "true" : "false";
    case GgufType::kFloat32: case GgufType::kFloat64: out << float_; return out.str();
    case GgufType::kArray: {
      const size_t n = array_size();
      out << "[";
      for (size_t i = 0; i < n && i < max_items; ++i) {
        if (i) out << ", ";
        switch (elem_type_) {
          case GgufType::kString: out << quoted(strs_[i]); break;
          case GgufType::kArray: out << items_[i].to_string(max_items); break;
          case GgufType::kFloat32: case GgufType::kFloat64: out << floats_[i]; break;
          case GgufType::kUint64: out << static_cast<uint64_t>(ints_[i]); break;
          case GgufType::kBool: out << (ints_[i] ? "true" : "false"); break;
          default: out << ints_[i];
        }
      }
      if (n > max_items) out << ", ... (" << n << " items)";
      out << "]";
      return out.str();
    }
    default:
      if (big_unsigned_) out << static_cast<uint64_t>(int_);
      else out << int_;
      return out.str();
  }
}

// ---------------------------------------------------------------------------------------------
// Parser: a bounds-checked cursor over the mapped bytes.

class GgufParser {
 public:
  GgufParser(GgufFile& file, std::shared_ptr<const std::filesystem::path> path)
      : file_(file), path_(std::move(path)), data_(file.map_.data()), size_(file.map_.size()) {}

  void parse() {
    if (size_ < 4) problem("truncated: ", size_, " bytes, too short for a GGUF header");
    const uint32_t magic = read_u32("magic");
    if (magic != kGgufMagic) {
      char shown[5] = {};
      std::memcpy(shown, &magic, 4);
      for (char& c : shown) {
        if (c != 0 && (c < 32 || c > 126)) c = '?';
      }
      problem("wrong magic '", shown, "' (0x", std::hex, magic, std::dec,
              "), expected 'GGUF': not a GGUF file");
    }
    const uint32_t version = read_u32("version");
    if (version == 1) problem("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
      if ((version & 0xFFFF) == 0 && version != 0) {
        problem("GGUF version 0x", std::hex, version, std::dec,
                " looks big-endian: only little-endian GGUF files are supported");
      }
      problem("unsupported GGUF version ", version, " (only versions 2 and 3)");
    }
    file_.version_ = version;
    const uint64_t n_tensors = read_u64("tensor count");
    const uint64_t n_kv = read_u64("metadata count");
    // Every key-value pair takes at least 8 + 4 + 1 bytes and every tensor info 8 + 4 + 8 + 4 + 8.
    if (n_kv > remaining() / 13 || n_tensors > remaining() / 32 ||
        n_kv * 13 + n_tensors * 32 > remaining()) {
      problem("truncated or corrupt: ", n_kv, " metadata entries and ", n_tensors,
              " tensors cannot fit in the ", remaining(), " bytes after the header");
    }

    file_.values_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
      GgufValue value;
      value.file_ = path_;
      value.key_ = read_string(str_cat("key of metadata entry ", i));
      const uint32_t type = read_u32(str_cat("type of key '", value.key_, "'"));
      if (!valid_gguf_type(type)) problem("key '", value.key_, "': unknown value type ", type);
      value.type_ = static_cast<GgufType>(type);
      read_value(value, 0);
      if (file_.value_index_.count(value.key_)) problem("duplicate key '", value.key_, "'");
      file_.value_index_.emplace(value.key_, file_.values_.size());
      file_.values_.push_back(std::move(value));
    }

    if (const GgufValue* a = file_.find("general.alignment")) {
      if (a->type() != GgufType::kUint32) {
        problem("key 'general.alignment': expected UINT32, got ", gguf_type_name(a->type()));
      }
      const int64_t align = a->as_int();
      if (align == 0 || (align & (align - 1)) != 0) {
        problem("key 'general.alignment': ", align, " is not a power of two");
      }
      file_.alignment_ = static_cast<size_t>(align);
    }

    file_.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) read_tensor_info(i);

    const size_t align = file_.alignment_;
    file_.data_offset_ = (pos_ + align - 1) / align * align;
    if (n_tensors > 0 && file_.data_offset_ > size_) {
      problem("truncated: tensor data section would start at byte ", file_.data_offset_,
              " but the file has ", size_, " bytes");
    }
    for (GgufTensorInfo& t : file_.tensors_) {
      if (t.offset % align != 0) {
        problem("tensor '", t.name, "': offset ", t.offset, " is not a multiple of the alignment ",
                align);
      }
      const uint64_t begin = file_.data_offset_ + t.offset;
      if (t.offset > size_ || begin > size_ || t.n_bytes > size_ - begin) {
        problem("truncated: tensor '", t.name, "' needs bytes [", begin, ", ", begin + t.n_bytes,
                ") but the file has ", size_, " bytes");
      }
      t.data = data_ + begin;
    }
  }

 private:
  template <class... Parts>
  [[noreturn]] void problem(Parts&&... parts) const {
    fail(path_->string(), ": ", std::forward<Parts>(parts)...);
  }

  size_t remaining() const { return size_ - pos_; }

  void need(size_t n, const std::string& what) const {
    if (n > remaining()) {
      problem("truncated: need ", n, " bytes at offset ", pos_, " for ", what, " but the file has ",
              size_, " bytes");
    }
  }

  template <class T>
  T read_raw(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t read_u32(const std::string& what) { return read_raw<uint32_t>(what); }
  uint64_t read_u64(const std::string& what) { return read_raw<uint64_t>(what); }

  std::string read_string(const std::string& what) {
    const uint64_t n = read_u64(what + " (length)");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  // Reads one scalar of type `t` into (int, float, string) slots.
  void read_scalar(GgufType t, const std::string& what, int64_t& i, bool& big, double& f,
                   std::string& s) {
    big = false;
    switch (t) {
      case GgufType::kUint8: i = read_raw<uint8_t>(what); break;
      case GgufType::kInt8: i = read_raw<int8_t>(what); break;
      case GgufType::kUint16: i = read_raw<uint16_t>(what); break;
      case GgufType::kInt16: i = read_raw<int16_t>(what); break;
      case GgufType::kUint32: i = read_raw<uint32_t>(what); break;
      case GgufType::kInt32: i = read_raw<int32_t>(what); break;
      case GgufType::kUint64: {
        const uint64_t u = read_raw<uint64_t>(what);
        i = static_cast<int64_t>(u);
        big = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
        break;
      }
      case GgufType::kInt64: i = read_raw<int64_t>(what); break;
      case GgufType::kBool: {
        const uint8_t b = read_raw<uint8_t>(what);
        if (b > 1) problem(what, ": BOOL byte ", int(b), " is neither 0 nor 1");
        i = b;
        break;
      }
      case GgufType::kFloat32: f = read_raw<float>(what); break;
      case GgufType::kFloat64: f = read_raw<double>(what); break;
      case GgufType::kString: s = read_string(what); break;
      case GgufType::kArray: break;  // handled by read_value
    }
  }

  void read_value(GgufValue& v, int depth) {
    const std::string what = str_cat("value of key '", v.key_, "'");
    if (v.type_ != GgufType::kArray) {
      read_scalar(v.type_, what, v.int_, v.big_unsigned_, v.float_, v.str_);
      return;
    }
    if (depth >= kMaxArrayDepth) problem("key '", v.key_, "': arrays nested deeper than ", kMaxArrayDepth);
    const uint32_t et = read_u32(what + " (array element type)");
    if (!valid_gguf_type(et)) problem("key '", v.key_, "': unknown array element type ", et);
    v.elem_type_ = static_cast<GgufType>(et);
    const uint64_t n = read_u64(what + " (array length)");
    // Each element takes at least one byte (strings 8, arrays 12): refuse impossible counts
    // before allocating.
    const size_t min_bytes = v.elem_type_ == GgufType::kString  ? 8
                             : v.elem_type_ == GgufType::kArray ? 12
                                                                : scalar_bytes(v.elem_type_);
    if (n > remaining() / min_bytes) {
      problem("truncated: key '", v.key_, "': array of ", n, " ", gguf_type_name(v.elem_type_),
              " does not fit in the ", remaining(), " bytes left");
    }
    switch (v.elem_type_) {
      case GgufType::kString:
        v.strs_.reserve(n);
        for (uint64_t k = 0; k < n; ++k) v.strs_.push_back(read_string(what));
        break;
      case GgufType::kArray:
        v.items_.reserve(n);
        for (uint64_t k = 0; k < n; ++k) {
          GgufValue item;
          item.file_ = v.file_;
          item.key_ = str_cat(v.key_, "[", k, "]");
          item.type_ = GgufType::kArray;
          read_value(item, depth + 1);
          v.items_.push_back(std::move(item));
        }
        break;
      case GgufType::kFloat32: case GgufType::kFloat64: {
        v.floats_.resize(n);
        int64_t i = 0; bool big = false; std::string s;
        for (uint64_t k = 0; k < n; ++k) read_scalar(v.elem_type_, what, i, big, v.floats_[k], s);
        break;
      }
      default: {
        v.ints_.resize(n);
        double f = 0; bool big = false; std::string s;
        for (uint64_t k = 0; k < n; ++k) read_scalar(v.elem_type_, what, v.ints_[k], big, f, s);
      }
    }
  }

  void read_tensor_info(uint64_t i) {
    GgufTensorInfo t;
    t.name = read_string(str_cat("name of tensor ", i));
    const std::string what = str_cat("tensor '", t.name, "'");
    const uint32_t n_dims = read_u32(what + " (dimension count)");
    if (n_dims < 1 || n_dims > kMaxDims) problem(what, ": ", n_dims, " dimensions (expected 1..", kMaxDims, ")");
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = read_u64(what + " (shape)");
      if (ne == 0 || ne > (uint64_t{1} << 40)) problem(what, ": dimension ", d, " has size ", ne);
      if (n_elements > (int64_t{1} << 50) / static_cast<int64_t>(ne)) problem(what, ": too many elements");
      n_elements *= static_cast<int64_t>(ne);
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t type = read_u32(what + " (type)");
    // Other ggml types (Q4_K, ...) are listed with n_bytes = 0 so that the metadata and tokenizer
    // of such a file stay readable; load_model refuses them by name.
    t.type = static_cast<GgmlType>(type);
    if (const int64_t block = ggml_block_values(t.type); block > 1 && t.ne[0] % block != 0) {
      problem(what, ": ", ggml_type_name(type), " needs ne[0] to be a multiple of ", block, ", got ", t.ne[0]);
    }
    t.offset = read_u64(what + " (offset)");
    t.n_bytes = ggml_tensor_bytes(t.type, n_elements);
    t.data = nullptr;
    if (file_.tensor_index_.count(t.name)) problem("duplicate tensor name '", t.name, "'");
    file_.tensor_index_.emplace(t.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(t));
  }

  GgufFile& file_;
  std::shared_ptr<const std::filesystem::path> path_;
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile file;
  file.map_ = MappedFile::open(path);
  GgufParser parser(file, std::make_shared<const std::filesystem::path>(path));
  parser.parse();
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = value_index_.find(key);
  return it == value_index_.end() ? nullptr : &values_[it->second];
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail(path().string(), ": missing key '", key, "'");
  return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kvlab
