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
#include "framework/experiment/results_test_util.h"

#include <sstream>

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using namespace results_testing;


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

// fuzz_results (UBSan, 2026-12-07: "5.6295e+14 is outside the range of representable values of
// type 'int'" in the report's aggregate, 51,552 executions): a cell's trials attribute became
// 5.6e14, which the report summed into an int it never printed (the sum is gone). The report
// prints the file; the value shows as it is stored. (The conversion was undefined behaviour, so
// a plain build can pass either way: scripts/sanitize.sh, like the fuzz build, fails without the fix.)
TEST(Report, HugeTrialsAttributeIsReportedAsStored) {
  const fs::path path = temp_path("huge_trials.h5");
  ResultsFile f = ResultsFile::create(path, {{"name", std::string("huge")}, {"cells_total", int64_t(1)}});
  f.ensure_run("full", {{"policy_type", std::string("full")}, {"params", std::string("")}});
  CellRecord rec;
  rec.attrs = {{"kind", std::string("niah")}, {"context_length", int64_t(256)}, {"depth", 50.0},
               {"trials", 5.6295e14}, {"accuracy", 0.5}};
  Dataset lp;
  lp.data = std::vector<double>{-1.0, -3.0};
  rec.datasets["value_logprob"] = lp;
  f.write_cell("full", "niah_L256_D50", rec);
  std::ostringstream text, csv;
  print_report(ResultsFile::open(path), text);
  print_report(ResultsFile::open(path), csv, ReportFormat::kCsv);
  EXPECT_NE(text.str().find("cells complete: 1 / 1"), std::string::npos) << text.str();
  EXPECT_NE(csv.str().find("5.6295e+14"), std::string::npos) << csv.str();
  fs::remove(path);
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


}  // namespace
}  // namespace kvlab
