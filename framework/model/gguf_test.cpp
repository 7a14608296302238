// GGUF reader tests: files are built byte by byte here (independently of the Python writer), so a
// shared misunderstanding of the format cannot hide.
#include "framework/model/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "framework/core/error.h"

namespace kvlab {
namespace {

// Little-endian byte builder for GGUF files.
struct Bytes {
  std::string b;
  template <class T>
  Bytes& pod(T v) {
    char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.append(tmp, sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return pod(v); }
  Bytes& u64(uint64_t v) { return pod(v); }
  Bytes& str(const std::string& s) { u64(s.size()); b += s; return *this; }
  Bytes& key(const std::string& k, GgufType t) { str(k); return u32(static_cast<uint32_t>(t)); }
  void pad_to(size_t align) { while (b.size() % align) b.push_back('\0'); }
};

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("kvlab_gguf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

std::filesystem::path write_file(const std::string& name, const std::string& bytes) {
  auto p = temp_path(name);
  std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
  return p;
}

std::string error_of(const std::filesystem::path& p) {
  try {
    GgufFile::open(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A file with every scalar type, arrays of several types, a nested array and two tensors
// (F32 [3, 2] and F16 [4]) at the given alignment.
std::string full_file(uint32_t version, uint32_t alignment) {
  Bytes h;
  const int n_kv = 18 + (alignment != 32 ? 1 : 0);
  h.b = "GGUF";
  h.u32(version).u64(2).u64(n_kv);
  h.key("u8", GgufType::kUint8).pod<uint8_t>(200);
  h.key("i8", GgufType::kInt8).pod<int8_t>(-100);
  h.key("u16", GgufType::kUint16).pod<uint16_t>(60000);
  h.key("i16", GgufType::kInt16).pod<int16_t>(-30000);
  h.key("u32", GgufType::kUint32).pod<uint32_t>(4000000000u);
  h.key("i32", GgufType::kInt32).pod<int32_t>(-2000000000);
  h.key("f32", GgufType::kFloat32).pod<float>(1.5f);
  h.key("bool", GgufType::kBool).pod<uint8_t>(1);
  h.key("str", GgufType::kString).str("hello gguf");
  h.key("u64", GgufType::kUint64).pod<uint64_t>(uint64_t{1} << 40);
  h.key("i64", GgufType::kInt64).pod<int64_t>(-(int64_t{1} << 40));
  h.key("f64", GgufType::kFloat64).pod<double>(0.125);
  h.key("u64big", GgufType::kUint64).pod<uint64_t>(~uint64_t{0});
  h.key("arr.str", GgufType::kArray).u32(uint32_t(GgufType::kString)).u64(3).str("a").str("").str("ccc");
  h.key("arr.f32", GgufType::kArray).u32(uint32_t(GgufType::kFloat32)).u64(2).pod(-1.0f).pod(2.5f);
  h.key("arr.i32", GgufType::kArray).u32(uint32_t(GgufType::kInt32)).u64(3).pod(1).pod(-2).pod(3);
  h.key("arr.empty", GgufType::kArray).u32(uint32_t(GgufType::kUint8)).u64(0);
  // [[1, 2], [3]] as arrays of UINT16
  h.key("arr.nested", GgufType::kArray).u32(uint32_t(GgufType::kArray)).u64(2);
  h.u32(uint32_t(GgufType::kUint16)).u64(2).pod<uint16_t>(1).pod<uint16_t>(2);
  h.u32(uint32_t(GgufType::kUint16)).u64(1).pod<uint16_t>(3);
  if (alignment != 32) h.key("general.alignment", GgufType::kUint32).u32(alignment);
  // tensors: a F32 [rows 2, cols 3] matrix at offset 0 and an F16 vector after it
  const uint64_t t1_offset = (24 + alignment - 1) / alignment * alignment;
  h.str("mat").u32(2).u64(3).u64(2).u32(0).u64(0);
  h.str("vec").u32(1).u64(4).u32(1).u64(t1_offset);
  h.pad_to(alignment);
  const size_t data_start = h.b.size();
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) h.pod(v);
  h.pad_to(alignment);
  EXPECT_EQ(h.b.size() - data_start, t1_offset);
  for (uint16_t v : {0x3C00, 0x4000, 0xC000, 0x0000}) h.pod(v);  // 1, 2, -2, 0 in fp16
  return h.b;
}

class GgufVersions : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

TEST_P(GgufVersions, ReadsEveryMetadataTypeArraysAndTensors) {
  const auto [version, alignment] = GetParam();
  const auto path = write_file("full_" + std::to_string(version) + "_" + std::to_string(alignment) +
                                   ".gguf", full_file(version, alignment));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), version);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.at("u8").as_int(), 200);
  EXPECT_EQ(f.at("u8").type(), GgufType::kUint8);
  EXPECT_EQ(f.at("i8").as_int(), -100);
  EXPECT_EQ(f.at("u16").as_int(), 60000);
  EXPECT_EQ(f.at("i16").as_int(), -30000);
  EXPECT_EQ(f.at("u32").as_int(), 4000000000LL);
  EXPECT_EQ(f.at("i32").as_int(), -2000000000);
  EXPECT_FLOAT_EQ(f.at("f32").as_float(), 1.5f);
  EXPECT_TRUE(f.at("bool").as_bool());
  EXPECT_EQ(f.at("bool").as_int(), 1);
  EXPECT_EQ(f.at("str").as_string(), "hello gguf");
  EXPECT_EQ(f.at("u64").as_int(), int64_t{1} << 40);
  EXPECT_EQ(f.at("i64").as_int(), -(int64_t{1} << 40));
  EXPECT_DOUBLE_EQ(f.at("f64").as_float(), 0.125);
  EXPECT_DOUBLE_EQ(f.at("i32").as_float(), -2000000000.0);
  EXPECT_DOUBLE_EQ(f.at("u64big").as_float(), 18446744073709551615.0);
  EXPECT_THROW(f.at("u64big").as_int(), Error);

  EXPECT_EQ(f.at("arr.str").array_type(), GgufType::kString);
  EXPECT_EQ(f.at("arr.str").array_size(), 3u);
  EXPECT_EQ(f.at("arr.str").as_strings(), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.at("arr.f32").as_floats(), (std::vector<float>{-1.f, 2.5f}));
  EXPECT_EQ(f.at("arr.i32").as_ints(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.at("arr.i32").as_floats(), (std::vector<float>{1.f, -2.f, 3.f}));
  EXPECT_EQ(f.at("arr.empty").array_size(), 0u);
  const auto& nested = f.at("arr.nested").as_arrays();
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].as_ints(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested[1].as_ints(), (std::vector<int64_t>{3}));
  EXPECT_EQ(nested[1].key(), "arr.nested[1]");
  EXPECT_EQ(f.metadata().front().key(), "u8");
  EXPECT_EQ(f.at("arr.str").to_string(), "[\"a\", \"\", \"ccc\"]");

  EXPECT_EQ(f.find("absent"), nullptr);
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* mat = f.find_tensor("mat");
  ASSERT_NE(mat, nullptr);
  EXPECT_EQ(mat->ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(mat->type, GgmlType::kF32);
  EXPECT_EQ(mat->n_bytes, 24u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mat->data) % alignment, 0u);  // mmap is page aligned
  const float* m = static_cast<const float*>(mat->data);
  EXPECT_EQ(m[0], 1.f);
  EXPECT_EQ(m[5], 6.f);
  const GgufTensorInfo* vec = f.find_tensor("vec");
  ASSERT_NE(vec, nullptr);
  EXPECT_EQ(vec->type, GgmlType::kF16);
  EXPECT_EQ(vec->n_bytes, 8u);
  EXPECT_EQ(static_cast<const uint16_t*>(vec->data)[2], 0xC000);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(VersionsAndAlignments, GgufVersions,
                         ::testing::Values(std::make_tuple(2u, 32u), std::make_tuple(3u, 32u),
                                           std::make_tuple(3u, 64u), std::make_tuple(2u, 8u)));

TEST(Gguf, TypeErrorsNameFileAndKey) {
  const auto path = write_file("types.gguf", full_file(3, 32));
  const GgufFile f = GgufFile::open(path);
  try {
    f.at("str").as_int();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("'str'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("STRING"), std::string::npos) << msg;
  }
  EXPECT_THROW(f.at("u8").as_string(), Error);
  EXPECT_THROW(f.at("u8").as_bool(), Error);
  EXPECT_THROW(f.at("arr.str").as_floats(), Error);
  EXPECT_THROW(f.at("arr.f32").as_ints(), Error);
  EXPECT_THROW(f.at("u8").array_size(), Error);
  try {
    f.at("missing.key");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing key 'missing.key'"), std::string::npos);
  }
}

TEST(Gguf, MovedFileKeepsDataValid) {
  const auto path = write_file("move.gguf", full_file(3, 32));
  GgufFile a = GgufFile::open(path);
  const void* data = a.find_tensor("mat")->data;
  GgufFile b = std::move(a);
  EXPECT_EQ(b.find_tensor("mat")->data, data);
  EXPECT_EQ(static_cast<const float*>(b.find_tensor("mat")->data)[1], 2.f);
  EXPECT_EQ(b.at("str").as_string(), "hello gguf");
}

TEST(Gguf, EveryTruncationIsAnErrorNotACrash) {
  const std::string full = full_file(3, 32);
  for (size_t n = 0; n < full.size(); ++n) {
    const auto path = write_file("trunc.gguf", full.substr(0, n));
    const std::string msg = error_of(path);
    ASSERT_FALSE(msg.empty()) << "prefix of " << n << " bytes was accepted";
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << "at " << n << ": " << msg;
  }
}

TEST(Gguf, WrongMagic) {
  std::string bytes = full_file(3, 32);
  bytes[0] = 'X';
  const std::string msg = error_of(write_file("magic.gguf", bytes));
  EXPECT_NE(msg.find("wrong magic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic.gguf"), std::string::npos) << msg;
}

TEST(Gguf, UnsupportedVersions) {
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    std::string bytes = full_file(3, 32);
    std::memcpy(&bytes[4], &v, 4);
    const std::string msg = error_of(write_file("version.gguf", bytes));
    EXPECT_NE(msg.find("version"), std::string::npos) << msg;
  }
}

TEST(Gguf, OtherTensorTypesAreListedButUnsupported) {
  Bytes h;
  h.b = "GGUF";
  h.u32(3).u64(1).u64(1);
  h.key("general.architecture", GgufType::kString).str("llama");
  h.str("iq4").u32(1).u64(32).u32(20 /* IQ4_NL */).u64(0);
  h.pad_to(32);
  h.b.append(18, '\0');
  const GgufFile f = GgufFile::open(write_file("iq4.gguf", h.b));
  EXPECT_EQ(f.at("general.architecture").as_string(), "llama");  // metadata still readable
  const GgufTensorInfo* t = f.find_tensor("iq4");
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->supported());
  EXPECT_EQ(static_cast<uint32_t>(t->type), 20u);
  EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(t->type)), "IQ4_NL");
  EXPECT_EQ(t->n_bytes, 0u);
  EXPECT_NE(t->data, nullptr);

  Bytes beyond;  // the offset must still lie within the file
  beyond.b = "GGUF";
  beyond.u32(3).u64(1).u64(0);
  beyond.str("iq4").u32(1).u64(32).u32(20 /* IQ4_NL */).u64(1 << 20);
  beyond.pad_to(32);
  EXPECT_NE(error_of(write_file("iq4_beyond.gguf", beyond.b)).find("truncated"), std::string::npos);
}

// The block types kvlab runs: sizes from ggml-common.h's block structs, and ne[0] must be a
// multiple of the block (32 or 256 values), else an error naming the tensor and the type.
TEST(Gguf, BlockQuantSizesAndRowLengthCheck) {
  const std::pair<uint32_t, size_t> types[] = {{2, 18}, {3, 20}, {6, 22}, {7, 24}, {10, 84},
                                               {11, 110}, {12, 144}, {13, 176}, {14, 210}};
  for (auto [id, block_bytes] : types) {
    const int64_t values = id <= 7 ? 32 : 256;
    Bytes h;
    h.b = "GGUF";
    h.u32(3).u64(1).u64(0);
    h.str("w").u32(2).u64(static_cast<uint64_t>(values)).u64(3).u32(id).u64(0);
    h.pad_to(32);
    h.b.append(3 * block_bytes, '\0');
    const GgufFile f = GgufFile::open(write_file("blocks.gguf", h.b));
    const GgufTensorInfo* t = f.find_tensor("w");
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->supported()) << ggml_type_name(id);
    EXPECT_EQ(t->n_bytes, 3 * block_bytes) << ggml_type_name(id);
    EXPECT_EQ(ggml_block_values(t->type), values);

    Bytes odd;  // a row of values + 16 cannot hold whole blocks
    odd.b = "GGUF";
    odd.u32(3).u64(1).u64(0);
    odd.str("w").u32(2).u64(static_cast<uint64_t>(values + 16)).u64(1).u32(id).u64(0);
    odd.pad_to(32);
    odd.b.append(4 * block_bytes, '\0');
    const std::string msg = error_of(write_file("odd_blocks.gguf", odd.b));
    EXPECT_NE(msg.find(ggml_type_name(id) + " needs ne[0] to be a multiple of " + std::to_string(values)),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  }
}

TEST(Gguf, Q8_0SizesAndRowLengthCheck) {
  Bytes h;
  h.b = "GGUF";
  h.u32(3).u64(1).u64(0);
  h.str("q8").u32(2).u64(64).u64(3).u32(8).u64(0);
  h.pad_to(32);
  h.b.append(6 * 34, '\0');
  const GgufFile f = GgufFile::open(write_file("q8.gguf", h.b));
  EXPECT_EQ(f.find_tensor("q8")->n_bytes, 6u * 34u);

  Bytes bad;
  bad.b = "GGUF";
  bad.u32(3).u64(1).u64(0);
  bad.str("q8").u32(1).u64(40).u32(8).u64(0);
  bad.pad_to(32);
  bad.b.append(34 * 2, '\0');
  EXPECT_NE(error_of(write_file("q8bad.gguf", bad.b)).find("multiple of 32"), std::string::npos);
}

TEST(Gguf, RejectsDuplicatesMisalignmentAndAbsurdCounts) {
  Bytes dup;
  dup.b = "GGUF";
  dup.u32(3).u64(0).u64(2);
  dup.key("k", GgufType::kUint8).pod<uint8_t>(1);
  dup.key("k", GgufType::kUint8).pod<uint8_t>(2);
  EXPECT_NE(error_of(write_file("dup.gguf", dup.b)).find("duplicate key 'k'"), std::string::npos);

  Bytes mis;
  mis.b = "GGUF";
  mis.u32(3).u64(1).u64(0);
  mis.str("t").u32(1).u64(2).u32(0).u64(4);
  mis.pad_to(32);
  mis.b.append(64, '\0');
  EXPECT_NE(error_of(write_file("mis.gguf", mis.b)).find("not a multiple of the alignment"),
            std::string::npos);

  Bytes huge;
  huge.b = "GGUF";
  huge.u32(3).u64(0).u64(1);
  huge.key("a", GgufType::kArray).u32(uint32_t(GgufType::kString)).u64(uint64_t{1} << 60);
  EXPECT_NE(error_of(write_file("huge.gguf", huge.b)).find("truncated"), std::string::npos);

  Bytes badtype;
  badtype.b = "GGUF";
  badtype.u32(3).u64(0).u64(1);
  badtype.key("k", static_cast<GgufType>(13)).pod<uint8_t>(1);
  EXPECT_NE(error_of(write_file("badtype.gguf", badtype.b)).find("unknown value type 13"),
            std::string::npos);
}

TEST(Gguf, MissingFileAndDirectory) {
  const std::string msg = error_of("/nonexistent/dir/model.gguf");
  EXPECT_NE(msg.find("/nonexistent/dir/model.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  EXPECT_NE(error_of(std::filesystem::temp_directory_path()).find("directory"), std::string::npos);
}

// IEEE half -> float from the bit fields, independent of dtype.h (and of _Float16, which clang 14
// supports on x86-64 only with AVX512-FP16).
float half_bits_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                             : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return sign ? -mag : mag;
}

// The Python writer the fixtures use (scripts/fixtures/gguf_writer.py), read back by this reader.
class PythonWriter : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PythonWriter, EveryValueAndTensorTypeRoundTrips) {
  const auto [version, alignment] = GetParam();
  const auto path = temp_path("py_" + std::to_string(version) + "_" + std::to_string(alignment) + ".gguf");
  const std::string cmd = std::string("/usr/bin/python3 ") + KVLAB_SOURCE_DIR +
                          "/scripts/fixtures/gguf_writer_sample.py " + path.string() + " --version " +
                          std::to_string(version) + " --alignment " + std::to_string(alignment);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), static_cast<uint32_t>(version));
  EXPECT_EQ(f.alignment(), static_cast<size_t>(alignment));
  EXPECT_EQ(f.at("t.default_int").type(), GgufType::kInt32);
  EXPECT_EQ(f.at("t.default_int").as_int(), -7);
  EXPECT_EQ(f.at("t.float").type(), GgufType::kFloat32);
  EXPECT_EQ(f.at("t.float").as_float(), 0.25);
  EXPECT_TRUE(f.at("t.bool").as_bool());
  EXPECT_EQ(f.at("t.string").as_string(), "h\xc3\xa9llo");
  const std::pair<const char*, GgufType> ints[] = {
      {"uint8", GgufType::kUint8},   {"int8", GgufType::kInt8},   {"uint16", GgufType::kUint16},
      {"int16", GgufType::kInt16},   {"uint32", GgufType::kUint32}, {"int32", GgufType::kInt32},
      {"uint64", GgufType::kUint64}, {"int64", GgufType::kInt64}};
  for (int i = 0; i < 8; ++i) {
    const GgufValue& v = f.at(std::string("t.") + ints[i].first);
    EXPECT_EQ(v.type(), ints[i].second) << ints[i].first;
    EXPECT_EQ(v.as_int(), ints[i].first[0] == 'u' ? 100 + i : -(100 + i)) << ints[i].first;
  }
  EXPECT_EQ(f.at("t.float64").type(), GgufType::kFloat64);
  EXPECT_DOUBLE_EQ(f.at("t.float64").as_float(), 1.0 / 3.0);
  EXPECT_EQ(f.at("t.list_int").array_type(), GgufType::kInt32);
  EXPECT_EQ(f.at("t.list_int").as_ints(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.at("t.list_str").as_strings(), (std::vector<std::string>{"a", "bc"}));
  ASSERT_EQ(f.at("t.nested").as_arrays().size(), 2u);
  EXPECT_EQ(f.at("t.nested").as_arrays()[0].as_ints(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(f.at("t.empty").array_type(), GgufType::kFloat32);
  EXPECT_EQ(f.at("t.empty").array_size(), 0u);
  EXPECT_EQ(f.at("t.u64s").as_ints(), (std::vector<int64_t>{1, int64_t{1} << 40}));
  EXPECT_EQ(f.at("t.bools").as_ints(), (std::vector<int64_t>{1, 0}));

  const GgmlType types[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0};
  const char* names[] = {"m.f32", "m.f16", "m.bf16", "m.q8_0"};
  const size_t bytes[] = {3 * 64 * 4, 3 * 64 * 2, 3 * 64 * 2, 3 * 2 * 34};
  for (int t = 0; t < 4; ++t) {
    const GgufTensorInfo* info = f.find_tensor(names[t]);
    ASSERT_NE(info, nullptr) << names[t];
    EXPECT_EQ(info->type, types[t]);
    EXPECT_EQ(info->ne, (std::vector<int64_t>{64, 3}));
    EXPECT_EQ(info->n_bytes, bytes[t]);
    EXPECT_EQ(info->offset % alignment, 0u);
  }
  // Exactly representable values (k/64 - 1) survive F32/F16/BF16 unchanged.
  const auto* f32 = static_cast<const float*>(f.find_tensor("m.f32")->data);
  const auto* f16 = static_cast<const uint16_t*>(f.find_tensor("m.f16")->data);
  const auto* bf16 = static_cast<const uint16_t*>(f.find_tensor("m.bf16")->data);
  for (int i = 0; i < 3 * 64; ++i) {
    const float want = i / 64.0f - 1.0f;
    EXPECT_EQ(f32[i], want);
    EXPECT_EQ(half_bits_to_float(f16[i]), want);  // (no inf/NaN here)
    EXPECT_EQ(std::bit_cast<float>(static_cast<uint32_t>(bf16[i]) << 16), want);
  }
  // Q8_0: block 0 holds -1 .. -33/64: scale 1/127 in fp16, first quant -127.
  const auto* q8 = static_cast<const uint8_t*>(f.find_tensor("m.q8_0")->data);
  uint16_t d;
  std::memcpy(&d, q8, 2);
  EXPECT_NEAR(half_bits_to_float(d), 1.0f / 127.0f, 1e-5f);
  EXPECT_EQ(static_cast<int8_t>(q8[2]), -127);
  const auto* v = static_cast<const float*>(f.find_tensor("v.f32")->data);
  EXPECT_EQ(f.find_tensor("v.f32")->ne, (std::vector<int64_t>{3}));
  EXPECT_EQ(v[2], 3.25f);
}

INSTANTIATE_TEST_SUITE_P(VersionsAndAlignments, PythonWriter,
                         ::testing::Values(std::make_tuple(3, 32), std::make_tuple(2, 32),
                                           std::make_tuple(3, 64)));

}  // namespace
}  // namespace kvlab
