// Corrupt results files, continued (results_corrupt_test.cpp): the messages of an object header
// whose contents libhdf5 1.10.8 trusts (attribute data, datatype classes, filter pipelines, fill
// values, the number of chunks a dataset spans), each refused with one error naming the file and
// the object header before libhdf5 decodes it. fuzz_results found most of them (fuzz/README.md).
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/results.h"
#include "framework/experiment/results_test_util.h"

namespace kvlab {
namespace {

using namespace results_testing;

// fuzz_results (ASan heap-buffer-overflow, 2026-12-07: a 48-byte read past a 168-byte chunk
// image in H5O__msg_iterate_real under H5Aexists, 41,231 executions): the root attribute
// 'schema_version' (one 8-byte integer) had a datatype of 48-byte integers; libhdf5 1.10.8
// copies elements x datatype size of data out of the message without comparing it with what the
// message holds. Rebuilt from a file kvlab writes: refused at open naming the attribute message.
TEST(Results, AttributeDataThatDoesNotFitItsMessageIsRefused) {
  const fs::path path = temp_path("attr_data.h5");
  { ResultsFile::create(path, {}); }
  const std::string bytes = file_bytes(path);
  ASSERT_NO_THROW(ResultsFile::open(path));
  // The v1 attribute message: {1, 0, u16 name size 15, u16 datatype size, u16 dataspace size},
  // the name padded to 16 bytes, then the datatype {0x10: class 0 (integer) version 1, bit field,
  // u32 size 8, ...}.
  const size_t name = bytes.find(std::string("schema_version\0", 15));
  ASSERT_NE(name, std::string::npos);
  ASSERT_EQ(bytes.compare(name + 16, 8, std::string("\x10\x08\x00\x00\x08\x00\x00\x00", 8)), 0);
  std::string corrupt = bytes;
  corrupt[name + 16 + 4] = 48;
  write_file_bytes(path, corrupt);
  expect_object_header_refused(path, [&] { ResultsFile::open(path); },
                               "has an attribute message whose data (1 elements of 48 bytes) does not fit its 8 bytes");
  fs::remove_all(path.parent_path());
}

// Found reading libhdf5 after the finding above: every datatype kvlab writes is an integer, a
// float or a (variable-length) string; a datatype of another class (compound, array, enum, ...)
// would only reach libhdf5's decoders for those, and is refused first — in an attribute message
// and in a dataset's datatype message.
TEST(Results, DatatypeOfAClassKvlabDoesNotWriteIsRefused) {
  const fs::path path = temp_path("dtype_class.h5");
  const std::string bytes = sample_cell_file(path);
  const size_t name = bytes.find(std::string("schema_version\0", 15));
  ASSERT_NE(name, std::string::npos);
  ASSERT_EQ(bytes[name + 16], '\x10');  // integer, version 1
  const size_t type = first_float_datatype(bytes);  // the chunked 'nll' dataset's
  ASSERT_NE(type, std::string::npos) << "no float datatype message";
  expect_byte_corruptions_refused(path, bytes,
                                  {{name + 16, '\x16', "has a datatype of class 6, which kvlab does not write"},  // compound
                                   {type, '\x1a', "has a datatype of class 10, which kvlab does not write"}},     // array
                                  [&] { ResultsFile::open(path).read_cell("full", "ppl_T0"); });
  fs::remove_all(path.parent_path());
}

// Likewise the filters: kvlab's datasets are shuffled and deflated; a pipeline naming another
// filter (szip, nbit, scale-offset, ...) or of another version is refused before libhdf5 decodes
// its parameters or runs it on chunk data.
TEST(Results, FilterKvlabDoesNotWriteIsRefused) {
  const fs::path path = temp_path("filters.h5");
  const std::string bytes = sample_cell_file(path);
  // {u16 type 11, u16 size 48, u8 flags, 3 reserved} {version 1, 2 filters, 6 reserved} {u16 id 2
  // (shuffle), ...}: the first filter pipeline message.
  const size_t pipeline = bytes.find(std::string("\x0b\x00\x30\x00\x01\x00\x00\x00\x01\x02\0\0\0\0\0\0\x02\x00", 18));
  ASSERT_NE(pipeline, std::string::npos);
  expect_byte_corruptions_refused(path, bytes,
                                  {{pipeline + 16, '\x04', "has a filter pipeline with filter 4, which kvlab does not write"},
                                   {pipeline + 8, '\x03', "has a filter pipeline of version 3"}},
                                  [&] { ResultsFile::open(path).read_cell("full", "ppl_T0"); });
  fs::remove_all(path.parent_path());
}

// fuzz_results (LeakSanitizer, 2026-12-07: 128 bytes under H5Dopen2 -> H5D__layout_oh_read, 29,299
// executions): a cell dataset's fill value message {version 2, allocation time 3, write time 2,
// defined 1, u32 size 0} became {2, 3, 0, 2, size 256}; libhdf5 1.10.8 had read the filter
// pipeline before it and leaks it when the fill value does not fit. Rebuilt from a file kvlab
// writes: that message, one of an unknown version, and an old-style fill value message (type 4)
// claiming more bytes than it holds are refused before libhdf5 opens the dataset.
TEST(Results, FillValueThatDoesNotFitItsMessageIsRefused) {
  const fs::path path = temp_path("fill.h5");
  const std::string bytes = sample_cell_file(path);
  // {u16 type 5, u16 size 8, u8 flags 1, 3 reserved} then the body kvlab's datasets carry.
  const std::string message("\x05\x00\x08\x00\x01\x00\x00\x00\x02\x03\x02\x01\x00\x00\x00\x00", 16);
  const size_t fill = bytes.find(message);
  ASSERT_NE(fill, std::string::npos) << "no fill value message";
  ASSERT_NO_THROW(ResultsFile::open(path).read_cell("full", "ppl_T0"));
  const struct {
    std::string header_and_body;
    std::string expected;
  } cases[] = {
      {std::string("\x05\x00\x08\x00\x01\x00\x00\x00\x02\x03\x00\x02\x00\x01\x00\x00", 16),
       "has a fill value of 256 bytes that does not fit its 8-byte message"},
      {std::string("\x05\x00\x08\x00\x01\x00\x00\x00\x07\x03\x02\x01\x00\x00\x00\x00", 16),
       "has a fill value message of version 7 in 8 bytes"},
      {std::string("\x04\x00\x08\x00\x01\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00", 16),
       "has a fill value of 5 bytes that does not fit its 8-byte message"},
  };
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& c : cases) files.emplace_back(std::string(bytes).replace(fill, 16, c.header_and_body), c.expected);
  expect_each_refused(path, files, [&] { ResultsFile::open(path).read_cell("full", "ppl_T0"); });
  fs::remove_all(path.parent_path());
}

// fuzz_results (libFuzzer out-of-memory, 2026-12-07: 1.2 GB in 7.8M libhdf5 allocations under
// read_cell): a cell dataset's extent became 16,515,071 int64 elements in 2-element chunks, none
// stored; libhdf5 1.10.8 builds a record per chunk of the extent it reads. Rebuilt with the C++
// API: a complete cell gains a dataset of 2^20 elements in 1-element chunks (within the element
// limit: fill values need no storage) and is refused before the read; the intact cell reads.
TEST(Results, DatasetOfMoreChunksThanTheFileCanIndexIsRefused) {
  const fs::path path = temp_path("many_chunks.h5");
  { ResultsFile::create(path, {}).write_cell("full", "ppl_T0", sample_cell()); }
  EXPECT_NO_THROW(ResultsFile::open(path).read_cell("full", "ppl_T0"));
  {
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    const hsize_t n = hsize_t(1) << 20, one = 1;
    H5::DSetCreatPropList props;
    props.setChunk(1, &one);
    h.openGroup("/runs/full/cells/ppl_T0").createDataSet("many_chunks", H5::PredType::NATIVE_INT64, H5::DataSpace(1, &n), props);
  }
  // The limit is file bytes / 16 + 4096 chunks: below 2^20 for any file under ~16 MB.
  ASSERT_LT(fs::file_size(path), 16u << 20);
  try {
    ResultsFile::open(path).read_cell("full", "ppl_T0");
    ADD_FAILURE() << "a dataset of 2^20 unstored chunks was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("many_chunks' spans more than "), std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (libFuzzer out-of-memory at 2.5 GB RSS after 100,688 executions, 2026-12-07): within
// both limits above, a dataset may still span a few thousand chunks of 65,536 elements and store
// none; libhdf5 reads unstored chunks as fill values, so nothing in the file bounds what the read
// allocates. kvlab stores every chunk it writes; a dataset storing fewer is refused. Rebuilt with
// the C++ API: an int64 dataset of 2 x 65,536 elements in chunks of 65,536, never written.
TEST(Results, DatasetWithUnstoredChunksIsRefused) {
  const fs::path path = temp_path("unstored.h5");
  const std::string bytes = sample_cell_file(path);
  {
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    const hsize_t n = hsize_t(2) << 16, chunk = hsize_t(1) << 16;
    H5::DSetCreatPropList props;
    props.setChunk(1, &chunk);
    h.openGroup("/runs/full/cells/ppl_T0").createDataSet("unstored", H5::PredType::NATIVE_INT64, H5::DataSpace(1, &n), props);
  }
  try {
    ResultsFile::open(path).read_cell("full", "ppl_T0");
    ADD_FAILURE() << "a dataset storing none of its chunks was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unstored' stores 0 of the 2 chunks its extent spans"), std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (ASan heap-buffer-overflow, a 12-byte read in H5VM_memcpyvv under H5D__select_read,
// 24,776 executions, 2026-12-07): a deflated float chunk that inflated to fewer bytes than its
// chunk; libhdf5 1.10.8 copies the whole chunk out of what the filter returned. Rebuilt with
// H5Dwrite_chunk: a deflated dataset of 6 floats in one chunk whose stored stream inflates to 12
// bytes instead of 24.
TEST(Results, ChunkThatInflatesShortIsRefused) {
  const fs::path path = temp_path("short_chunk.h5");
  const std::string bytes = sample_cell_file(path);
  {
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    const hsize_t n = 6;
    H5::DSetCreatPropList props;
    props.setChunk(1, &n);
    props.setDeflate(4);
    H5::DataSet d = h.openGroup("/runs/full/cells/ppl_T0").createDataSet("short", H5::PredType::NATIVE_FLOAT,
                                                                          H5::DataSpace(1, &n), props);
    const float half[3] = {1, 2, 3};
    std::vector<unsigned char> z(64);
    uLongf z_size = z.size();
    ASSERT_EQ(compress(z.data(), &z_size, reinterpret_cast<const Bytef*>(half), sizeof half), Z_OK);
    const hsize_t offset = 0;
    ASSERT_GE(H5Dwrite_chunk(d.getId(), H5P_DEFAULT, 0, &offset, z_size, z.data()), 0);
  }
  try {
    ResultsFile::open(path).read_cell("full", "ppl_T0");
    ADD_FAILURE() << "a chunk inflating to 12 of its 24 bytes was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short': a chunk at byte "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not inflate to its 24 bytes"), std::string::npos) << e.what();
  }
  fs::remove_all(path.parent_path());
}

}  // namespace
}  // namespace kvlab
