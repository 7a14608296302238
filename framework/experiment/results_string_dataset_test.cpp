// A string dataset whose stored values libhdf5 1.10.8 would trust unchecked (fuzz_results:
// ASan memcpy-param-overlap in H5HG_read under H5T__conv_vlen, a summary's string dataset
// naming a heap object its collection does not hold) is refused before its strings are read.
// Each corrupt file is made from one kvlab wrote: its string chunk is read raw (H5Dread_chunk),
// inflated and unshuffled here, one value changed, and written back raw (H5Dwrite_chunk).
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/results.h"
#include "framework/experiment/results_test_util.h"

namespace kvlab {
namespace {

using namespace results_testing;

constexpr size_t kStringBytes = 16;  // {u32 length, u64 heap collection offset, u32 object index}

// Byte b of element e at b * count + e, as HDF5's shuffle filter stores them.
std::vector<unsigned char> shuffled(const std::vector<unsigned char>& v) {
  std::vector<unsigned char> out(v.size());
  const size_t count = v.size() / kStringBytes;
  for (size_t e = 0; e < count; ++e)
    for (size_t b = 0; b < kStringBytes; ++b) out[b * count + e] = v[e * kStringBytes + b];
  return out;
}

// A cell of three strings written by kvlab whose first stored string {length, collection,
// index} is changed by `patch` (or whose stored chunk is replaced by `raw`; with `shuffle` the
// chunk is written shuffled, its mask saying so); returns the error reading the cell gives (""
// when it reads).
std::string string_dataset_patched(const std::string& name, const std::function<void(unsigned char* value)>& patch,
                                   const std::vector<unsigned char>* raw = nullptr, bool shuffle = false) {
  const fs::path path = temp_path(name);
  {
    ResultsFile f = ResultsFile::create(path, {});
    f.ensure_run("r", {});
    CellRecord cell;
    Dataset answers;
    answers.data = std::vector<std::string>{"1234567", "", "üñí"};
    cell.datasets["answers"] = answers;
    f.write_cell("r", "c", cell);
  }
  EXPECT_EQ(std::get<std::vector<std::string>>(ResultsFile::open(path).read_cell("r", "c").datasets.at("answers").data)[0],
            "1234567");
  {
    H5::H5File f(path.string(), H5F_ACC_RDWR);
    const H5::DataSet d = f.openDataSet("runs/r/cells/c/answers");
    hsize_t offset = 0, stored = 0;
    unsigned mask = 0;
    haddr_t addr = 0;
    EXPECT_GE(H5Dget_chunk_info(d.getId(), d.getSpace().getId(), 0, &offset, &mask, &addr, &stored), 0);
    std::vector<unsigned char> chunk(stored);
    EXPECT_GE(H5Dread_chunk(d.getId(), H5P_DEFAULT, &offset, &mask, chunk.data()), 0);
    // libhdf5 skips the (optional) shuffle filter on variable-length data: bit 0 of the mask.
    EXPECT_EQ(mask, 1u);
    std::vector<unsigned char> values(3 * kStringBytes);
    uLongf inflated = values.size();
    EXPECT_EQ(uncompress(values.data(), &inflated, chunk.data(), chunk.size()), Z_OK);
    EXPECT_EQ(inflated, values.size());
    uint32_t length = 0;
    std::memcpy(&length, values.data(), 4);
    EXPECT_EQ(length, 7u);  // "1234567"
    patch(values.data());
    if (shuffle) {
      values = shuffled(values);
      mask = 0;
    }
    std::vector<unsigned char> out(compressBound(values.size()));
    uLongf deflated = out.size();
    EXPECT_EQ(compress(out.data(), &deflated, values.data(), values.size()), Z_OK);
    out.resize(deflated);
    if (raw) out = *raw;
    EXPECT_GE(H5Dwrite_chunk(d.getId(), H5P_DEFAULT, mask, &offset, out.size(), out.data()), 0);
  }
  std::string error;
  try {
    (void)ResultsFile::open(path).read_cell("r", "c");
  } catch (const Error& e) {
    error = e.what();
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
  fs::remove_all(path.parent_path());
  return error;
}

TEST(ResultsStringDataset, UnchangedChunkReads) {
  EXPECT_EQ(string_dataset_patched("same.h5", [](unsigned char*) {}), "");
}

// libhdf5 1.10.8 indexes the collection's object table with the stored index unchecked.
TEST(ResultsStringDataset, ValueNamingAMissingHeapObjectIsRefused) {
  const std::string e = string_dataset_patched("index.h5", [](unsigned char* v) {
    const uint32_t index = 0x04000001;
    std::memcpy(v + 12, &index, 4);
  });
  EXPECT_NE(e.find("dataset '/runs/r/cells/c/answers': a string value names object 67108865 of the global heap collection at byte"),
            std::string::npos)
      << e;
}

// A claimed length libhdf5 would allocate (4 GiB - 1) or copy the longer object past (5 of 7).
TEST(ResultsStringDataset, ValueLengthMustMatchItsHeapObject) {
  for (const uint32_t claimed : {0xffffffffu, 5u}) {
    const std::string e =
        string_dataset_patched("length.h5", [&](unsigned char* v) { std::memcpy(v, &claimed, 4); });
    EXPECT_NE(e.find("dataset '/runs/r/cells/c/answers': a string value claims " + std::to_string(claimed) +
                     " bytes; its global heap object holds 7"),
              std::string::npos)
        << e;
  }
}

// A value pointing at bytes that are no global heap collection.
TEST(ResultsStringDataset, ValuePointingOutsideAnyHeapCollectionIsRefused) {
  const std::string e = string_dataset_patched("collection.h5", [](unsigned char* v) {
    const uint64_t collection = 8;  // inside the superblock
    std::memcpy(v + 4, &collection, 8);
  });
  EXPECT_NE(e.find("dataset '/runs/r/cells/c/answers': a string value points at a global heap collection at byte 8 that the file "
                   "does not hold"),
            std::string::npos)
      << e;
}

// Deflated bytes that inflate to something else than a chunk's 3 strings of 16 bytes.
TEST(ResultsStringDataset, ChunkThatDoesNotInflateToItsSizeIsRefused) {
  const std::vector<unsigned char> garbage(40, 0x5a);
  std::vector<unsigned char> short_chunk(compressBound(32));
  {
    const std::vector<unsigned char> zeros(32, 0);
    uLongf n = short_chunk.size();
    ASSERT_EQ(compress(short_chunk.data(), &n, zeros.data(), zeros.size()), Z_OK);
    short_chunk.resize(n);
  }
  const std::vector<const std::vector<unsigned char>*> raws = {&garbage, &short_chunk};
  for (const std::vector<unsigned char>* raw : raws) {
    const std::string e = string_dataset_patched("inflate.h5", [](unsigned char*) {}, raw);
    EXPECT_NE(e.find("dataset '/runs/r/cells/c/answers': a chunk at byte"), std::string::npos) << e;
    EXPECT_NE(e.find("does not inflate to its 48 bytes"), std::string::npos) << e;
  }
}

// kvlab's pipeline stores the shuffle without an element size (libhdf5 skips it on strings): a
// chunk whose mask says it was shuffled cannot be unshuffled as libhdf5 would.
TEST(ResultsStringDataset, ShuffledChunkWithoutElementSizeIsRefused) {
  const std::string e = string_dataset_patched("shuffle.h5", [](unsigned char*) {}, nullptr, true);
  EXPECT_NE(e.find("went through the shuffle filter without an element size"), std::string::npos) << e;
}

// fuzz_results (libFuzzer out-of-memory, 2.2 GB of string pointers): a string dataset whose
// chunks are not stored reads as empty strings, so nothing in the file bounds its extent. kvlab
// writes every string; a dataset of 10 strings with one of its two chunks stored is refused.
TEST(ResultsStringDataset, StringsNotStoredInAnyChunkAreRefused) {
  const fs::path path = temp_path("unstored.h5");
  {
    ResultsFile f = ResultsFile::create(path, {});
    f.ensure_run("r", {});
    CellRecord cell;
    cell.datasets["answers"].data = std::vector<std::string>{"1234567"};
    f.write_cell("r", "c", cell);
  }
  {
    H5::H5File f(path.string(), H5F_ACC_RDWR);
    const hsize_t dims = 10, chunk = 5, first = 0, count = 5;
    H5::DataSpace space(1, &dims);
    H5::DSetCreatPropList props;
    props.setChunk(1, &chunk);
    props.setDeflate(4);
    const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    H5::DataSet d = f.openGroup("runs/r/cells/c").createDataSet("half", type, space, props);
    space.selectHyperslab(H5S_SELECT_SET, &count, &first);
    const H5::DataSpace memory(1, &count);
    const char* five[5] = {"a", "b", "c", "d", "e"};
    d.write(five, type, memory, space);
  }
  try {
    (void)ResultsFile::open(path).read_cell("r", "c");
    ADD_FAILURE() << "a string dataset with an unstored chunk was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset '/runs/r/cells/c/half': it holds 10 strings, of which its chunks "
                                         "store 5"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// Strings past one chunk: the edge chunk's padding is not read, its values are.
TEST(ResultsStringDataset, StringsAcrossChunksRead) {
  const fs::path path = temp_path("many.h5");
  std::vector<std::string> many(70001);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i % 3 ? std::to_string(i) : "";
  {
    ResultsFile f = ResultsFile::create(path, {});
    f.ensure_run("r", {});
    CellRecord cell;
    cell.datasets["answers"].data = many;
    f.write_cell("r", "c", cell);
  }
  EXPECT_EQ(std::get<std::vector<std::string>>(ResultsFile::open(path).read_cell("r", "c").datasets.at("answers").data),
            many);
  fs::remove_all(path.parent_path());
}

}  // namespace
}  // namespace kvlab
