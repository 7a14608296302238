// Corrupt results files (fuzz_results' findings among them): each is refused with one error
// naming the file and what is wrong, before libhdf5 trusts the corrupt part.
#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/hdf5_checks.h"
#include "framework/experiment/results.h"
#include "framework/experiment/results_test_util.h"

namespace kvlab {
namespace {

using namespace results_testing;

// Issue 11 (found by fuzz_results): a corrupt file with a valid HDF5 signature made every open
// retry for kOpenWaitSeconds (2 minutes) as if another process held a lock. Only lock failures
// are waited for now.
TEST(Results, CorruptFileFailsAtOnce) {
  const fs::path path = temp_path("corrupt.h5");
  {
    ResultsFile f = ResultsFile::create(path, {{"name", std::string("x")}});
    f.ensure_run("full", {{"policy_type", std::string("full")}});
  }
  std::string bytes = file_bytes(path);
  ASSERT_GT(bytes.size(), 1024u);
  for (size_t keep : {size_t{600}, bytes.size() / 2, bytes.size() - 16}) {
    { std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), keep); }
    const auto start = std::chrono::steady_clock::now();
    try {
      ResultsFile g = ResultsFile::open(path);
      (void)g.runs();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 10.0) << keep << " bytes kept";  // a lock wait would take 120 s
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results: a global heap object claiming 262,144 bytes inside a 4,096-byte collection made
// libhdf5's H5HG_read copy past the collection (ASan: memcpy-param-overlap) while reading a
// string attribute. The collections are checked before HDF5 reads the file.
TEST(Results, CorruptGlobalHeapIsRefusedBeforeHdf5ReadsIt) {
  const fs::path path = temp_path("heap.h5");
  { ResultsFile::create(path, {{"name", std::string("a string attribute, stored in the global heap")}}); }
  std::string bytes = file_bytes(path);
  ASSERT_EQ(ResultsFile::open(path).root_attrs().count("name"), 1u);  // intact: opens
  const size_t gcol = bytes.find("GCOL");
  ASSERT_NE(gcol, std::string::npos);
  // Collection header: "GCOL", version, 3 reserved, u64 size; then object 1: u16 index, u16
  // refcount, u32 reserved, u64 size (this file's lengths are 8 bytes).
  const size_t object = gcol + 16;
  ASSERT_EQ(bytes[object], 1);
  const uint64_t huge = 1 << 18;
  std::memcpy(&bytes[object + 8], &huge, 8);
  write_file_bytes(path, bytes);
  try {
    ResultsFile::open(path);
    ADD_FAILURE() << "corrupt global heap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt HDF5 global heap at byte " + std::to_string(gcol)), std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (ASan allocation-size-too-big in H5C_protect, at H5Fopen): a dictionary word
// written over the root group's object header made the length of its continuation chunk ~8 EiB,
// which libhdf5 1.10.8 mallocs before comparing it with the file's end. Rebuilt here from a file
// kvlab writes: the root object header's chunk 0, its continuation and the root group's local
// heap each claim more bytes than the file holds; each is refused by name before libhdf5 opens
// the file, and the intact file opens. Also (LeakSanitizer, 56 bytes from H5FL_blk_malloc at
// H5Fopen): a continuation message whose size says 0 bytes, which libhdf5 decodes anyway and
// then leaks the chunk it was reading; (the same leak, from H5C_load_entry) a continuation
// whose chunk length is 0; and (424 bytes, 2026-12-07) a chunk 0 whose messages do not tile it.
TEST(Results, CorruptObjectHeaderOrHeapIsRefusedBeforeHdf5OpensIt) {
  const fs::path path = temp_path("ohdr.h5");
  { ResultsFile::create(path, {{"name", std::string("a string attribute")}, {"count", int64_t(3)}}); }
  const std::string bytes = file_bytes(path);
  ASSERT_EQ(ResultsFile::open(path).root_attrs().count("name"), 1u);  // intact: opens
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, &bytes[at], 8);
    return v;
  };
  // Superblock version 0 with 8-byte offsets and lengths (what libhdf5 writes): the root group's
  // symbol table entry at byte 56 {name offset, object header address, cache type, reserved,
  // scratch {B-tree, local heap}}.
  ASSERT_EQ(bytes[8], 0);
  ASSERT_EQ(bytes[13], 8);
  ASSERT_EQ(bytes[14], 8);
  const size_t root = u64(64), heap = u64(88);
  ASSERT_EQ(bytes[root], 1);                       // a version-1 object header
  ASSERT_EQ(bytes.compare(heap, 4, "HEAP"), 0);   // the root group's local heap
  // The continuation message among the root header's chunk-0 messages {u16 type, u16 size, u8
  // flags, 3 reserved, body}: kvlab's root header has one (its attributes overflow chunk 0).
  uint32_t chunk0 = 0;
  std::memcpy(&chunk0, &bytes[root + 8], 4);
  size_t continuation = 0;
  for (size_t p = root + 16; p + 8 <= root + 16 + chunk0;) {
    const unsigned type = uint8_t(bytes[p]) | unsigned(uint8_t(bytes[p + 1])) << 8;
    const unsigned size = uint8_t(bytes[p + 2]) | unsigned(uint8_t(bytes[p + 3])) << 8;
    if (type == 0x10) continuation = p + 8;
    p += 8 + size;
  }
  ASSERT_NE(continuation, 0u) << "the root object header has no continuation message";
  const uint64_t huge = uint64_t(1) << 62;
  const uint32_t huge32 = 0xfffffff0u;
  const uint16_t zero = 0;
  const uint64_t zero64 = 0;
  const std::string past_the_end = "past the end of the " + std::to_string(bytes.size()) + "-byte file";
  // (fuzz_results, LeakSanitizer: 424 bytes from H5FL_reg_calloc under H5Fopen -> H5G_mkroot:
  // an inserted byte shifted the root header's chunk size; its messages no longer tiled chunk 0.)
  const uint32_t chunk0_short = chunk0 - 4, chunk0_long = chunk0 + 4;
  const std::string at_chunk0 = "-byte chunk at byte " + std::to_string(root + 16);
  struct Corruption {
    size_t at;
    const void* value;
    size_t size;
    std::string expected, reason;
  } cases[] = {
      {root + 8, &huge32, 4, "the object header at byte " + std::to_string(root) + " has a chunk of 4294967280 bytes",
       past_the_end},
      {continuation + 8, &huge, 8,
       "the object header at byte " + std::to_string(root) + " has a chunk of 4611686018427387904 bytes", past_the_end},
      {heap + 8, &huge, 8, "the local heap at byte " + std::to_string(heap) + " claims 4611686018427387904 bytes",
       past_the_end},
      {continuation - 6, &zero, 2,
       "the object header at byte " + std::to_string(root) + " has a message of type 16 and 0 bytes at byte " +
           std::to_string(continuation - 8),
       "which libhdf5 does not write"},
      {continuation + 8, &zero64, 8,
       "the object header at byte " + std::to_string(root) + " has a chunk of 0 bytes at byte " +
           std::to_string(u64(continuation)),
       "which libhdf5 does not write"},
      {root + 8, &chunk0_short, 4, "the object header at byte " + std::to_string(root) + " has a message of ",
       "running past the end of its " + std::to_string(chunk0_short) + at_chunk0},
      {root + 8, &chunk0_long, 4,
       "the object header at byte " + std::to_string(root) + " ends its " + std::to_string(chunk0_long) + at_chunk0,
       "with 4 bytes that hold no message"},
  };
  for (const Corruption& c : cases) {
    std::string corrupt = bytes;
    std::memcpy(&corrupt[c.at], c.value, c.size);
    write_file_bytes(path, corrupt);
    try {
      ResultsFile::open(path);
      ADD_FAILURE() << "accepted: " << c.expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string() + ": " + c.expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.reason), std::string::npos) << e.what();
    }
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (libFuzzer out-of-memory, malloc(4294967283) in H5Dread): a dataset chunk's size
// in its B-tree key said ~4 GiB; libhdf5 1.10.8 allocates it before reading the chunk. Rebuilt
// from a file kvlab writes (the `nll` dataset of a cell, chunked and deflated): refused at open.
TEST(Results, DatasetChunkPastTheFileIsRefusedBeforeHdf5ReadsIt) {
  const fs::path path = temp_path("chunk.h5");
  { ResultsFile::create(path, {}).write_cell("full", "ppl_T0", sample_cell()); }
  std::string bytes = file_bytes(path);
  // The first level-0 chunk B-tree node ("TREE", type 1, level 0, u16 entries, two 8-byte
  // siblings, then key 0 {u32 chunk bytes, u32 filter mask, 2 u64 offsets: the cell's datasets
  // are 1-D} and child 0, a chunk's address).
  size_t key = 0;
  uint64_t chunk = 0;
  for (size_t at = bytes.find("TREE"); at != std::string::npos && key == 0; at = bytes.find("TREE", at + 4)) {
    if (bytes[at + 4] == 1 && bytes[at + 5] == 0 && at + 24 + 24 + 8 <= bytes.size()) {
      key = at + 24;
      std::memcpy(&chunk, &bytes[key + 24], 8);
    }
  }
  ASSERT_NE(key, 0u) << "no chunk B-tree node in a file with a chunked dataset";
  uint32_t stored = 0;
  std::memcpy(&stored, &bytes[key], 4);
  ASSERT_LT(chunk + stored, bytes.size());  // the intact key describes a chunk inside the file
  const uint32_t huge = 0xfffffff0u;
  std::memcpy(&bytes[key], &huge, 4);
  write_file_bytes(path, bytes);
  try {
    ResultsFile::open(path).read_cell("full", "ppl_T0");
    ADD_FAILURE() << "a chunk past the file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": a dataset chunk at byte " + std::to_string(chunk) +
                                         " claims 4294967280 bytes, past the end of the " +
                                         std::to_string(bytes.size()) + "-byte file"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (ASan heap-buffer-overflow in H5VM_memcpyvv under H5Dread): a deflated dataset
// whose filter pipeline message the fuzzer had broken; libhdf5 1.10.8 reads an unfiltered chunk's
// stored bytes (its B-tree key: 20-odd deflated bytes) into a buffer of that size, then copies a
// whole chunk (2 x 3 floats, 24 bytes) out of it. Rebuilt here: a chunked, unfiltered 2 x 3 float
// dataset (what kvlab writes for `attention_recall_per_layer`) whose chunk key says 20 bytes.
TEST(Results, UnfilteredChunkOfTheWrongSizeIsRefusedBeforeHdf5ReadsIt) {
  const fs::path path = temp_path("unfiltered.h5");
  {
    H5::H5File file(path.string(), H5F_ACC_TRUNC);
    const hsize_t dims[2] = {2, 3};
    H5::DSetCreatPropList plist;
    plist.setChunk(2, dims);
    const float values[6] = {1, 2, 3, 4, 5, 6};
    file.createDataSet("recall", H5::PredType::NATIVE_FLOAT, H5::DataSpace(2, dims), plist)
        .write(values, H5::PredType::NATIVE_FLOAT);
  }
  std::string bytes = file_bytes(path);
  // The chunk B-tree node ("TREE", type 1, level 0, u16 entries, two 8-byte siblings; the root
  // group's B-tree is type 0), then key 0 {u32 chunk bytes, u32 filter mask, 3 u64 offsets: 2
  // dimensions and the element's}, child 0.
  size_t tree = bytes.find("TREE");
  while (tree != std::string::npos && bytes[tree + 4] != 1) tree = bytes.find("TREE", tree + 4);
  ASSERT_NE(tree, std::string::npos) << "no chunk B-tree node in a file with a chunked dataset";
  ASSERT_EQ(bytes[tree + 5], 0);
  const size_t key = tree + 24;
  uint32_t stored = 0;
  uint64_t chunk = 0;
  std::memcpy(&stored, &bytes[key], 4);
  std::memcpy(&chunk, &bytes[key + 32], 8);
  ASSERT_EQ(stored, 24u);                   // the intact key: 2 x 3 floats
  EXPECT_NO_THROW(hdf5::check_object_headers(path));  // and the intact file passes the checks
  const uint32_t shorter = 20;
  std::memcpy(&bytes[key], &shorter, 4);
  write_file_bytes(path, bytes);
  try {
    ResultsFile::open(path);
    ADD_FAILURE() << "an unfiltered chunk of 20 bytes where 24 are read was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": a dataset chunk at byte " + std::to_string(chunk) +
                                         " holds 20 bytes where its unfiltered dataset's chunks hold 24"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (LeakSanitizer, 128 bytes under H5Dopen2 -> H5D__layout_oh_read): a cell dataset's
// data layout message said version 0; libhdf5 1.10.8 had decoded the deflate pipeline before it
// and returns without freeing it. Rebuilt from a file kvlab writes (the cell's 1-D, deflated
// datasets): a layout of version 0, a chunk size of 0 (what fails H5D__chunk_init after the chunk
// cache is allocated), chunks of rank 2 for a rank-1 dataset and (a later finding, the same leak)
// a dataset whose layout message became a null message are refused before libhdf5 opens the
// dataset; the intact file reads.
TEST(Results, DataLayoutLibhdf5DoesNotWriteIsRefused) {
  const fs::path path = temp_path("layout.h5");
  const std::string bytes = sample_cell_file(path);
  // The first chunked layout message of a 1-D dataset: {u16 type 8, u16 size, u8 flags, 3
  // reserved} then {version 3, class 2, dimensionality 2, B-tree address, 2 u32 sizes}.
  size_t layout = std::string::npos;
  for (size_t p = 0; p + 24 <= bytes.size() && layout == std::string::npos; ++p)
    if (bytes.compare(p, 2, "\x08\x00", 2) == 0 && bytes.compare(p + 5, 3, "\0\0\0", 3) == 0 &&
        bytes.compare(p + 8, 3, "\x03\x02\x02", 3) == 0)
      layout = p + 8;
  ASSERT_NE(layout, std::string::npos) << "no chunked layout message in a file with chunked datasets";
  struct Corruption {
    size_t at;
    char value;
    std::string expected;
  } cases[] = {
      {layout, 0, "has a data layout message of version 0, which libhdf5 does not write"},
      {layout + 3 + 8, 0, "has a data layout message whose chunk size 0 is 0, which libhdf5 does not write"},
      {layout + 2, 3, "describes a dataset of rank 1 stored in chunks of rank 2"},
      {layout - 8, 0, "describes a dataset without a data layout message"},  // type 8 -> 0, a null message
  };
  std::vector<std::pair<std::string, std::string>> files;
  for (const Corruption& c : cases) {
    std::string corrupt = bytes;
    std::memset(&corrupt[c.at], 0, c.at == layout + 3 + 8 ? 4 : 1);
    corrupt[c.at] = c.value;
    // A third chunk size for the rank-2 case, in the message's padding (its body is padded to 24 bytes).
    if (c.at == layout + 2) corrupt[layout + 3 + 8 + 8] = 1;
    files.emplace_back(corrupt, c.expected);
  }
  expect_each_refused(path, files, [&] { ResultsFile::open(path).read_cell("full", "ppl_T0"); });
  fs::remove_all(path.parent_path());
}

// fuzz_results (LeakSanitizer, 4.2 KB of chunk cache and 128 B of pipeline under H5Dopen2 ->
// H5D__layout_oh_read, 2026-12-06): one bit made a chunked float dataset's datatype 2 GiB + 4
// bytes an element; libhdf5 1.10.8 allocates the chunk cache, finds the chunk over its 4 GiB limit
// and leaks both. A datatype size other than the layout's element size, and chunks of 4 GiB or
// more, are refused before libhdf5 opens the dataset.
TEST(Results, ChunkedDatasetWhoseElementsOrChunksLibhdf5CannotHoldIsRefused) {
  const fs::path path = temp_path("element.h5");
  const std::string bytes = sample_cell_file(path);
  const size_t type = first_float_datatype(bytes);  // the chunked 'nll' dataset's
  ASSERT_NE(type, std::string::npos) << "no float datatype message";
  // The first chunked layout of a 1-D dataset (as in DataLayoutLibhdf5DoesNotWriteIsRefused).
  size_t layout = std::string::npos;
  for (size_t p = 0; p + 24 <= bytes.size() && layout == std::string::npos; ++p)
    if (bytes.compare(p, 2, "\x08\x00", 2) == 0 && bytes.compare(p + 5, 3, "\0\0\0", 3) == 0 &&
        bytes.compare(p + 8, 3, "\x03\x02\x02", 3) == 0)
      layout = p + 8;
  ASSERT_NE(layout, std::string::npos);
  const struct {
    size_t at;
    uint32_t value;
    std::string expected;
  } cases[] = {
      {type + 4, 0x80000004u, "describes elements of 2147483652 bytes stored in chunks of 4-byte elements"},
      {layout + 3 + 8, 0x40000000u, "describes chunks of 4 GiB or more"},  // x an element of >= 4 bytes
  };
  for (const auto& c : cases) {
    std::string corrupt = bytes;
    std::memcpy(&corrupt[c.at], &c.value, 4);
    write_file_bytes(path, corrupt);
    expect_object_header_refused(path, [&] { ResultsFile::open(path).read_cell("full", "ppl_T0"); }, c.expected);
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (ASan SEGV in H5VM_memcpyvv under H5D__contig_read): a compact dataset whose stored
// size was 0; libhdf5 1.10.8 copies the dataset's whole extent out of its stored bytes without
// comparing the two. Rebuilt here with a compact and a contiguous 2 x 3 float dataset: a stored
// size other than 24 bytes, or contiguous data past the file's end, is refused; intact, both pass.
TEST(Results, CompactOrContiguousDataOfTheWrongSizeIsRefused) {
  const fs::path path = temp_path("compact.h5");
  for (const H5D_layout_t kind : {H5D_COMPACT, H5D_CONTIGUOUS}) {
    {
      H5::H5File file(path.string(), H5F_ACC_TRUNC);
      const hsize_t dims[2] = {2, 3};
      H5::DSetCreatPropList plist;
      plist.setLayout(kind);
      const float values[6] = {1, 2, 3, 4, 5, 6};
      file.createDataSet("recall", H5::PredType::NATIVE_FLOAT, H5::DataSpace(2, dims), plist)
          .write(values, H5::PredType::NATIVE_FLOAT);
    }
    std::string bytes = file_bytes(path);
    EXPECT_NO_THROW(hdf5::check_object_headers(path));
    // The layout message {u16 type 8, u16 size, u8 flags, 3 reserved} {version 3, class: 0
    // compact {u16 size, data}, 1 contiguous {u64 address, u64 size}}.
    const char body[2] = {3, char(kind == H5D_COMPACT ? 0 : 1)};
    size_t layout = std::string::npos;
    for (size_t p = 0; p + 16 <= bytes.size() && layout == std::string::npos; ++p)
      if (bytes.compare(p, 2, "\x08\x00", 2) == 0 && bytes.compare(p + 5, 3, "\0\0\0", 3) == 0 &&
          bytes.compare(p + 8, 2, body, 2) == 0)
        layout = p + 8;
    ASSERT_NE(layout, std::string::npos) << "no layout message of class " << int(body[1]);
    const size_t size_at = kind == H5D_COMPACT ? layout + 2 : layout + 2 + 8;
    uint16_t stored = 0;
    std::memcpy(&stored, &bytes[size_at], 2);
    ASSERT_EQ(stored, 24u);  // 2 x 3 floats
    std::vector<std::pair<size_t, uint64_t>> corruptions = {{size_at, 0}};
    if (kind == H5D_CONTIGUOUS) corruptions.push_back({layout + 2, bytes.size() - 8});  // data past the end
    for (const auto& [at, value] : corruptions) {
      std::string corrupt = bytes;
      std::memcpy(&corrupt[at], &value, kind == H5D_COMPACT ? 2 : 8);
      write_file_bytes(path, corrupt);
      const std::string expected =
          at == size_at ? "describes a dataset of 6 elements of 4 bytes stored in 0 bytes"
                        : "has its data at byte " + std::to_string(value) + ", 24 bytes past the end of the " +
                              std::to_string(bytes.size()) + "-byte file";
      expect_object_header_refused(path, [&] { ResultsFile::open(path); }, expected);
    }
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (ASan heap-buffer-overflow in H5O__msg_iterate_real under H5Aexists; it reproduced
// only inside the campaign, where libhdf5's free lists had handed out a buffer of just the
// header's size): an attribute message whose name, datatype and dataspace sizes add up to more
// than the message. Rebuilt from a file kvlab writes: the root attribute `count`'s name size
// grown to 0xfff0 is refused at open.
TEST(Results, AttributeMessageWhosePartsDoNotFitIsRefused) {
  const fs::path path = temp_path("attr_parts.h5");
  { ResultsFile::create(path, {{"count", int64_t(3)}}); }
  std::string bytes = file_bytes(path);
  // The attribute message {u16 type 0x0C, u16 size, u8 flags, 3 reserved} {version 1, reserved,
  // u16 name size 6, u16 datatype size, u16 dataspace size} then the name "count\0", padded.
  size_t message = std::string::npos;
  for (size_t at = bytes.find(std::string("count\0", 6)); at != std::string::npos && message == std::string::npos;
       at = bytes.find(std::string("count\0", 6), at + 1))
    if (at >= 16 && bytes[at - 16] == 0x0C && bytes[at - 15] == 0 && bytes[at - 8] == 1 && bytes[at - 6] == 6)
      message = at - 16;
  ASSERT_NE(message, std::string::npos) << "no version-1 attribute message named count";
  uint16_t size = 0;
  std::memcpy(&size, &bytes[message + 2], 2);
  {  // and (a later finding: ASan heap-buffer-overflow in strdup) a name without its NUL
    std::string corrupt = bytes;
    corrupt[message + 16 + 5] = 'x';
    write_file_bytes(path, corrupt);
    try {
      ResultsFile::open(path).root_attrs();
      ADD_FAILURE() << "an attribute name without its NUL was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has an attribute message whose name does not end within its 6 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  const uint16_t huge = 0xfff0;
  std::memcpy(&bytes[message + 8 + 2], &huge, 2);
  write_file_bytes(path, bytes);
  try {
    ResultsFile::open(path).root_attrs();
    ADD_FAILURE() << "an attribute whose name does not fit its message was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": the object header at byte "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has an attribute message whose name, datatype and dataspace"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("do not fit its " + std::to_string(size) + " bytes"), std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}

// fuzz_results (LeakSanitizer: 211 bytes allocated in libhdf5's H5HG_read, never freed): the input
// was a seed results file with two bytes changed in the datatype message of the root attribute
// 'experiment', a variable-length string: its character type said 0 bytes (and big-endian)
// instead of 1. libhdf5 1.10.8 then reads the heap object into a buffer it allocates itself and
// loses, and returns an empty string. Rebuilt here from a file kvlab writes; refused by name now.
TEST(Results, VariableLengthStringOfZeroByteCharactersIsRefused) {
  const fs::path path = temp_path("vlen_chars.h5");
  { ResultsFile::create(path, {{"experiment", std::string("name: seed\nmodel: {path: model.gguf}\n")}}); }
  std::string bytes = file_bytes(path);
  ASSERT_EQ(std::get<std::string>(ResultsFile::open(path).root_attrs().at("experiment")).substr(0, 10), "name: seed");
  // Datatype message of a UTF-8 variable-length string (version 1, class 9; string, cset 1;
  // size 16), then its character type: version 1, class 0 (integer), no flags, size 1.
  const std::string vlen_string("\x19\x01\x01\x00\x10\x00\x00\x00\x10\x00\x00\x00\x01\x00\x00\x00", 16);
  const size_t at = bytes.find(vlen_string);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 9] = 1;   // big-endian, as in the fuzzer's input
  bytes[at + 12] = 0;  // character size 0
  write_file_bytes(path, bytes);
  expect_root_attrs_refused(path, "attribute 'experiment' is a variable-length string of 0-byte characters",
                            "0-byte characters accepted");
  fs::remove_all(path.parent_path());
}

// Found reading the same code: a string attribute holding several variable-length strings made
// H5::Attribute::read(type, std::string) write every pointer into its one char* (past it, on the
// stack). kvlab writes one string per attribute; more is refused.
TEST(Results, StringAttributeArrayIsRefused) {
  const fs::path path = temp_path("string_array.h5");
  { ResultsFile::create(path, {{"name", std::string("x")}}); }
  {
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
    const hsize_t n = 2;
    H5::Attribute a = h.openGroup("/").createAttribute("host", t, H5::DataSpace(1, &n));
    const char* values[2] = {"one", "two"};
    a.write(t, values);
  }
  expect_root_attrs_refused(path, "attribute 'host' holds 2 strings, not one", "string array attribute accepted");
  fs::remove_all(path.parent_path());
}

// A results file whose root attribute 'experiment' (a variable-length string) has its stored
// value {u32 length, u64 heap collection offset, u32 object index} changed by `patch`; returns
// the error reading the root attributes gives ("" when it reads).
std::string string_value_patched(const std::string& name, const std::function<void(char* value)>& patch) {
  const fs::path path = temp_path(name);
  const std::string text = "name: seed\nmodel: {path: model.gguf}\n";  // 37 bytes
  { ResultsFile::create(path, {{"experiment", text}}); }
  std::string bytes = file_bytes(path);
  EXPECT_EQ(std::get<std::string>(ResultsFile::open(path).root_attrs().at("experiment")), text);
  const size_t gcol = bytes.find("GCOL");
  EXPECT_NE(gcol, std::string::npos);
  std::string value(12, '\0');
  const uint32_t length = uint32_t(text.size());
  const uint64_t collection = gcol;
  std::memcpy(&value[0], &length, 4);
  std::memcpy(&value[4], &collection, 8);
  const size_t at = bytes.find(value);
  EXPECT_NE(at, std::string::npos) << "no stored value {37, " << gcol << ", ...}";
  if (at == std::string::npos) return "not found";
  patch(&bytes[at]);
  write_file_bytes(path, bytes);
  std::string error;
  try {
    (void)ResultsFile::open(path).root_attrs();
  } catch (const Error& e) {
    error = e.what();
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
  fs::remove_all(path.parent_path());
  return error;
}

// fuzz_results (ASan: SEGV in libhdf5's H5HG_read): a seed file whose 'experiment' value named
// heap object 67,108,865 of a 4,096-byte collection. libhdf5 1.10.8 indexes its object table
// with it unchecked (only an assert).
TEST(Results, StringValueNamingAMissingHeapObjectIsRefused) {
  const std::string e = string_value_patched("heap_index.h5", [](char* v) {
    const uint32_t index = 0x04000001;
    std::memcpy(v + 12, &index, 4);
  });
  EXPECT_NE(e.find("attribute 'experiment': a string value of the object names object 67108865 of the global heap "
                   "collection at byte"),
            std::string::npos)
      << e;
}

// fuzz/README.md's known libhdf5 allocation: a value claiming 4 GiB - 1 bytes makes libhdf5
// allocate that much before it reads the (37-byte) heap object; a claim shorter than the object
// makes it copy the object past its buffer. Both are refused before the read.
TEST(Results, StringValueLengthMustMatchItsHeapObject) {
  for (const uint32_t claimed : {0xffffffffu, 5u}) {
    const std::string e = string_value_patched("heap_length.h5", [&](char* v) { std::memcpy(v, &claimed, 4); });
    EXPECT_NE(e.find("attribute 'experiment': a string value of the object claims " + std::to_string(claimed) +
                     " bytes; its global heap object holds 37"),
              std::string::npos)
        << e;
  }
}

// fuzz_results (ASan SEGV in strlen under H5::Attribute::p_read_variable_len, 2026-12-06): a
// string attribute's value naming collection 0, HDF5's null string. libhdf5 reads it as a null
// pointer, which the C++ API passed to strlen; kvlab now reads it as "" (a file it did not
// write, but not one to crash on).
TEST(Results, NullStringAttributeReadsAsEmpty) {
  const std::string e = string_value_patched("null_string.h5", [](char* v) { std::memset(v + 4, 0, 8); });
  EXPECT_EQ(e, "");
}

// fuzz_results (2026-12-07, the open-object check after 18,216 executions): a file from an
// older build with an interrupted cell whose dataset's object header is damaged. Resume's
// delete_incomplete_cells unlinked the cell in place; libhdf5 followed the cell's members to
// free their space, failed on the damaged header with its cache left dirty, and the close that
// had to write that cache back failed too, leaving the file open in the library. The cell is
// now dropped by copying what is kept into a new file (rebuild_file, through kvlab's own
// checked reader), so nothing of it is read.
TEST(Results, InterruptedCellWithADamagedMemberIsDeletedWithoutReadingIt) {
  const fs::path path = temp_path("damaged_interrupted.h5");
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("demo")}});
  f.ensure_run("full", {{"policy_type", std::string("full")}});
  f.write_cell("full", "a", sample_cell());
  haddr_t header = 0;
  {  // An older build killed mid-cell: a group with data but no complete attribute.
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    H5::Group g = h.createGroup("runs/full/cells/b");
    const hsize_t n = 3;
    g.createDataSet("x", H5::PredType::NATIVE_FLOAT, H5::DataSpace(1, &n));
    H5O_info_t info{};
    ASSERT_GE(H5Oget_info_by_name(h.getId(), "runs/full/cells/b/x", &info, H5P_DEFAULT), 0);
    header = info.addr;
  }
  std::string bytes = file_bytes(path);
  ASSERT_LT(header, bytes.size());
  ASSERT_EQ(bytes[header], 1);  // a version-1 object header
  bytes[header] = 7;            // a version libhdf5 does not know
  write_file_bytes(path, bytes);

  ResultsFile g = ResultsFile::open(path);
  EXPECT_EQ(g.delete_incomplete_cells(), 1);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE), 0);  // nothing left open in libhdf5
  EXPECT_EQ(g.delete_incomplete_cells(), 0);
  EXPECT_EQ(g.complete_cells("full"), std::vector<std::string>{"a"});
  EXPECT_EQ(std::get<std::string>(g.root_attrs().at("name")), "demo");
  EXPECT_EQ(std::get<std::string>(g.run_attrs("full").at("policy_type")), "full");
  const CellRecord kept = g.read_cell("full", "a");
  for (const auto& [name, ds] : sample_cell().datasets) EXPECT_EQ(kept.datasets.at(name).data, ds.data) << name;
  EXPECT_EQ(std::get<std::string>(kept.datasets.at("nll").attrs.at("unit")), "nats");
  fs::remove_all(path.parent_path());
}

}  // namespace
}  // namespace kvlab
