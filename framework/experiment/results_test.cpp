#include "framework/experiment/results.h"

#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "framework/core/error.h"
#include "framework/experiment/report.h"

#include <sstream>

namespace kvlab {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvlab_results_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

CellRecord sample_cell() {
  CellRecord rec;
  rec.attrs["kind"] = std::string("niah");
  rec.attrs["context_length"] = int64_t(512);
  rec.attrs["prefill_s"] = 0.25;
  rec.attrs["recall_per_layer"] = std::vector<double>{0.5, 0.75};
  rec.attrs["positions"] = std::vector<int64_t>{1, 2, 3};
  Dataset correct;
  correct.data = std::vector<int8_t>{1, 0, 1, 1, 0, 0};
  correct.shape = {2, 3};
  rec.datasets["correct"] = correct;
  Dataset nll;
  nll.data = std::vector<float>(100000, 0.5f);  // larger than one chunk
  nll.attrs["unit"] = std::string("nats");
  rec.datasets["nll"] = nll;
  Dataset answers;
  answers.data = std::vector<std::string>{"1234567", "", "üñí"};
  rec.datasets["answers"] = answers;
  Dataset empty;
  empty.data = std::vector<int64_t>{};
  rec.datasets["empty"] = empty;
  Dataset dbl;
  dbl.data = std::vector<double>{-1.5, 2.25};
  rec.datasets["lp"] = dbl;
  return rec;
}

TEST(Results, CellRoundTrip) {
  const fs::path path = temp_path("roundtrip.h5");
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("demo")}, {"seeds", std::vector<int64_t>{1, 2}}});
  f.ensure_run("win@window=32", {{"policy_type", std::string("window")}, {"param.window", int64_t(32)}});
  const CellRecord in = sample_cell();
  f.write_cell("win@window=32", "niah_L512_D50", in);

  ResultsFile g = ResultsFile::open(path);
  const AttrMap root = g.root_attrs();
  EXPECT_EQ(std::get<int64_t>(root.at("schema_version")), kResultsSchemaVersion);
  EXPECT_EQ(std::get<std::string>(root.at("name")), "demo");
  EXPECT_EQ(std::get<std::vector<int64_t>>(root.at("seeds")), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(g.runs(), std::vector<std::string>{"win@window=32"});
  EXPECT_EQ(std::get<int64_t>(g.run_attrs("win@window=32").at("param.window")), 32);
  EXPECT_EQ(g.complete_cells("win@window=32"), std::vector<std::string>{"niah_L512_D50"});

  const CellRecord out = g.read_cell("win@window=32", "niah_L512_D50");
  EXPECT_EQ(std::get<int64_t>(out.attrs.at("complete")), 1);
  for (const auto& [k, v] : in.attrs) EXPECT_EQ(out.attrs.at(k), v) << k;
  ASSERT_EQ(out.datasets.size(), in.datasets.size());
  for (const auto& [k, v] : in.datasets) {
    EXPECT_EQ(out.datasets.at(k).data, v.data) << k;
    EXPECT_EQ(out.datasets.at(k).dims(), v.dims()) << k;
  }
  EXPECT_EQ(std::get<std::string>(out.datasets.at("nll").attrs.at("unit")), "nats");

  // Writing a complete cell twice is a bug in the caller.
  EXPECT_THROW(g.write_cell("win@window=32", "niah_L512_D50", in), Error);
  fs::remove_all(path.parent_path());
}

TEST(Results, DatasetsAreChunkedAndCompressed) {
  const fs::path path = temp_path("chunked.h5");
  ResultsFile f = ResultsFile::create(path, {});
  f.write_cell("full", "ppl_T0", sample_cell());
  H5::H5File h(path.string(), H5F_ACC_RDONLY);
  H5::DataSet ds = h.openDataSet("runs/full/cells/ppl_T0/nll");
  H5::DSetCreatPropList props = ds.getCreatePlist();
  EXPECT_EQ(props.getLayout(), H5D_CHUNKED);
  EXPECT_GE(props.getNfilters(), 2);  // shuffle + deflate
  EXPECT_LT(ds.getStorageSize(), 100000 * sizeof(float) / 10);  // a constant compresses well
  fs::remove_all(path.parent_path());
}

TEST(Results, IncompleteCellsAreInvisibleAndDeletedOnResume) {
  const fs::path path = temp_path("incomplete.h5");
  ResultsFile f = ResultsFile::create(path, {});
  f.ensure_run("full", {});
  f.write_cell("full", "a", sample_cell());
  {  // Simulate a kill mid-cell: a group with data but no complete attribute.
    H5::H5File h(path.string(), H5F_ACC_RDWR);
    H5::Group g = h.createGroup("runs/full/cells/b");
    hsize_t n = 3;
    g.createDataSet("x", H5::PredType::NATIVE_FLOAT, H5::DataSpace(1, &n));
  }
  ResultsFile g = ResultsFile::open(path);
  EXPECT_EQ(g.complete_cells("full"), std::vector<std::string>{"a"});
  EXPECT_FALSE(g.cell_complete("full", "b"));
  EXPECT_TRUE(g.cell_complete("full", "a"));
  EXPECT_FALSE(g.cell_complete("nope", "a"));
  EXPECT_EQ(g.delete_incomplete_cells(), 1);
  EXPECT_EQ(g.delete_incomplete_cells(), 0);
  g.write_cell("full", "b", sample_cell());  // the interrupted cell can be written again
  EXPECT_EQ(g.complete_cells("full"), (std::vector<std::string>{"a", "b"}));
  fs::remove_all(path.parent_path());
}

TEST(Results, Summaries) {
  const fs::path path = temp_path("summary.h5");
  ResultsFile f = ResultsFile::create(path, {});
  f.ensure_run("full", {});
  Dataset correct;
  correct.data = std::vector<int8_t>{1, -1, 0, 1};
  correct.shape = {2, 2, 1};
  f.write_summary("full", "niah", {{"correct", correct}}, {{"n_complete", int64_t(3)}});
  f.write_summary("full", "niah", {{"correct", correct}}, {{"n_complete", int64_t(3)}});  // replace
  AttrMap attrs;
  const auto s = f.read_summary("full", "niah", &attrs);
  EXPECT_EQ(s.at("correct").dims(), (std::vector<uint64_t>{2, 2, 1}));
  EXPECT_EQ(std::get<int64_t>(attrs.at("n_complete")), 3);
  EXPECT_TRUE(f.read_summary("full", "perplexity").empty());
  fs::remove_all(path.parent_path());
}

TEST(Results, OpenRejectsOtherFiles) {
  const fs::path dir = temp_path("x").parent_path();
  EXPECT_THROW(ResultsFile::open(dir / "absent.h5"), Error);
  const fs::path text = dir / "text.h5";
  { std::ofstream(text) << "not hdf5"; }
  try {
    ResultsFile::open(text);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an HDF5 file"), std::string::npos) << e.what();
  }
  const fs::path other = dir / "other.h5";
  { H5::H5File h(other.string(), H5F_ACC_TRUNC); }
  EXPECT_THROW(ResultsFile::open(other), Error);
  fs::remove_all(dir);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// Reading the root attributes of `path` must fail with an Error naming the file and holding
// `message`; `accepted` is the failure reported when they read.
void expect_root_attrs_refused(const fs::path& path, const std::string& message, const char* accepted) {
  try {
    (void)ResultsFile::open(path).root_attrs();
    ADD_FAILURE() << accepted;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path.string()), std::string::npos) << m;
    EXPECT_NE(m.find(message), std::string::npos) << m;
  }
}

ino_t inode_of(const fs::path& p) {
  struct stat st{};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

// Every change is written to PATH.partial and renamed over PATH (results.h): the inode changes,
// no copy stays behind, a stale copy from a killed run is overwritten, and a change that fails
// leaves the file byte for byte as it was.
TEST(Results, EveryChangeReplacesTheFileWhole) {
  const fs::path path = temp_path("replace.h5");
  const fs::path partial = path.string() + ".partial";
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("demo")}});
  EXPECT_FALSE(fs::exists(partial));
  f.ensure_run("full", {});
  const ino_t before = inode_of(path);
  { std::ofstream(partial) << "left by a killed run"; }
  f.write_cell("full", "a", sample_cell());
  EXPECT_NE(inode_of(path), before);
  EXPECT_FALSE(fs::exists(partial));
  const std::string bytes = file_bytes(path);
  try {
    f.write_cell("full", "a", sample_cell());  // already complete: refused
    ADD_FAILURE() << "a second write of a complete cell was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path.string(), 0), 0u) << msg;
    EXPECT_NE(msg.find("already complete"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is unchanged"), std::string::npos) << msg;
  }
  EXPECT_EQ(file_bytes(path), bytes);
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_EQ(ResultsFile::open(path).complete_cells("full"), std::vector<std::string>{"a"});
  fs::remove_all(path.parent_path());
}

// A results file reached through a symbolic link: the link stays, its target gets the cell.
TEST(Results, ASymlinkStaysALink) {
  const fs::path target = temp_path("target.h5"), link = temp_path("link.h5");
  ResultsFile::create(target, {}).ensure_run("full", {});
  fs::create_symlink(target, link);
  ResultsFile::open(link).write_cell("full", "a", sample_cell());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(link.string() + ".partial"));
  EXPECT_EQ(ResultsFile::open(target).complete_cells("full"), std::vector<std::string>{"a"});
  fs::remove_all(target.parent_path());
}

// A small tmpfs mounted for one test (needs root or CAP_SYS_ADMIN; the test skips otherwise).
class ScopedTmpfs {
 public:
  ScopedTmpfs(const fs::path& dir, const std::string& options) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ = ::mount("kvlab_test", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  bool remount(const std::string& options, unsigned long flags = 0) {
    return ::mount("kvlab_test", dir_.c_str(), "tmpfs", MS_REMOUNT | flags, options.c_str()) == 0;
  }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// A cell of ~64 KiB that deflate cannot shrink (uniform random floats).
CellRecord incompressible_cell(uint32_t seed) {
  CellRecord rec = sample_cell();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> v(16384);
  for (float& x : v) x = u(rng);
  rec.datasets["nll"].data = std::move(v);
  return rec;
}

// Full disk: the write that does not fit throws one error naming the file and the system error;
// every cell written before stays readable; once there is room again the same cell is written.
TEST(Results, FullDiskKeepsFinishedCellsAndResumes) {
  const fs::path dir = temp_path("x").parent_path() / "tmpfs";
  ScopedTmpfs disk(dir, "size=512k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error() << "): needs root";
  const fs::path path = dir / "full.h5";
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("disk")}});
  f.ensure_run("full", {});
  int written = 0;
  std::string error;
  for (; written < 100; ++written) {
    try {
      f.write_cell("full", str_cat("c", 100 + written), incompressible_cell(written));
    } catch (const Error& e) {
      error = e.what();
      break;
    }
  }
  ASSERT_FALSE(error.empty()) << "512 KiB held 100 cells of 64 KiB";
  ASSERT_GE(written, 1) << error;
  EXPECT_EQ(error.rfind(path.string(), 0), 0u) << error;
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_NE(error.find("is unchanged"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));
  auto check_cells = [&](int n) {
    ResultsFile g = ResultsFile::open(path);
    ASSERT_EQ(int(g.complete_cells("full").size()), n);
    for (int i = 0; i < n; ++i) {
      const CellRecord back = g.read_cell("full", str_cat("c", 100 + i));
      EXPECT_EQ(std::get<std::vector<float>>(back.datasets.at("nll").data),
                std::get<std::vector<float>>(incompressible_cell(i).datasets.at("nll").data));
    }
  };
  check_cells(written);
  // Room again: the cell that failed is written and the earlier ones are still there.
  ASSERT_TRUE(disk.remount("size=8m")) << std::strerror(errno);
  f.write_cell("full", str_cat("c", 100 + written), incompressible_cell(written));
  check_cells(written + 1);
}

// A results file on a read-only file system (root ignores permission bits, so the test
// remounts its tmpfs read-only): creating or changing it is one clear error, the file unchanged.
TEST(Results, ReadOnlyFileSystemIsAClearError) {
  const fs::path dir = temp_path("x").parent_path() / "tmpfs_ro";
  ScopedTmpfs disk(dir, "size=1m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error() << "): needs root";
  const fs::path path = dir / "ro.h5";
  ResultsFile f = ResultsFile::create(path, {});
  f.ensure_run("full", {});
  f.write_cell("full", "a", sample_cell());
  const std::string bytes = file_bytes(path);
  ASSERT_TRUE(disk.remount("size=1m", MS_RDONLY)) << std::strerror(errno);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) f.write_cell("full", "b", sample_cell());
      else ResultsFile::create(dir / "new.h5", {});
      ADD_FAILURE() << "wrote on a read-only file system";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(attempt == 0 ? path.string() : (dir / "new.h5").string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("Read-only file system"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(file_bytes(path), bytes);
  EXPECT_EQ(ResultsFile::open(path).complete_cells("full"), std::vector<std::string>{"a"});
}

TEST(Report, NaturalOrder) {
  EXPECT_TRUE(natural_less("h2o_64", "h2o_512"));
  EXPECT_FALSE(natural_less("h2o_512", "h2o_64"));
  EXPECT_TRUE(natural_less("win@window=8", "win@window=16"));
  EXPECT_TRUE(natural_less("niah_L512_D100", "niah_L1024_D0"));
  EXPECT_TRUE(natural_less("niah_L512_D50", "niah_L512_D100"));
  EXPECT_TRUE(natural_less("a", "b"));
  EXPECT_FALSE(natural_less("x07", "x7"));  // equal numbers: neither is less
  EXPECT_FALSE(natural_less("x7", "x07"));
}

// A file of schema 1 (cells without keys_read_mean, value_logprob_mean, effective parameters):
// the report reads what it has and shows '-' for what it lacks, no NaN.
TEST(Report, ReadsSchemaOneCells) {
  const fs::path path = temp_path("schema1.h5");
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("old")}, {"cells_total", int64_t(2)},
                                             {"model_config", std::string("{\"n_layers\": 2, \"n_kv_heads\": 2}")}});
  f.set_root_attr("schema_version", int64_t(1));
  f.ensure_run("win@window=16", {{"policy_type", std::string("sliding_window")}, {"params", std::string("window=16")}});
  CellRecord rec;
  rec.attrs = {{"kind", std::string("niah")}, {"context_length", int64_t(256)}, {"depth", 50.0},
               {"trials", int64_t(2)}, {"accuracy", 0.5}, {"kv_bytes_peak", int64_t(4 * 4096)},
               {"attended_achieved_mean", 16.0}, {"decode_tokens", int64_t(9)}};
  Dataset lp;
  lp.data = std::vector<double>{-1.0, -3.0};
  rec.datasets["value_logprob"] = lp;
  f.write_cell("win@window=16", "niah_L256_D50", rec);
  std::ostringstream out;
  print_report(ResultsFile::open(path), out);
  const std::string t = out.str();
  EXPECT_NE(t.find("cells complete: 1 / 2  (partial file"), std::string::npos) << t;
  // accuracy 0.5, log-prob mean -2.00 (from the dataset), keys read 16.0, kept 16 KiB / 4 = 4.0 KiB.
  const size_t row = t.find("win@window=16  sliding_window  window=16");
  ASSERT_NE(row, std::string::npos) << t;
  const std::string line = t.substr(row, t.find('\n', row) - row);
  for (const char* v : {"0.500", "-2.00", "16.0", "4.0"}) EXPECT_NE(line.find(v), std::string::npos) << v << ": " << line;
  EXPECT_EQ(t.find("nan"), std::string::npos) << t;
  fs::remove(path);
}


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
// then leaks the chunk it was reading.
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
  const std::string past_the_end = "past the end of the " + std::to_string(bytes.size()) + "-byte file";
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
}  // namespace
}  // namespace kvlab
