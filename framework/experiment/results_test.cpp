#include "framework/experiment/results.h"

#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/core/error.h"

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


// Issue 11 (found by fuzz_results): a corrupt file with a valid HDF5 signature made every open
// retry for kOpenWaitSeconds (2 minutes) as if another process held a lock. Only lock failures
// are waited for now.
TEST(Results, CorruptFileFailsAtOnce) {
  const fs::path path = temp_path("corrupt.h5");
  {
    ResultsFile f = ResultsFile::create(path, {{"name", std::string("x")}});
    f.ensure_run("full", {{"policy_type", std::string("full")}});
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
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
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_EQ(ResultsFile::open(path).root_attrs().count("name"), 1u);  // intact: opens
  const size_t gcol = bytes.find("GCOL");
  ASSERT_NE(gcol, std::string::npos);
  // Collection header: "GCOL", version, 3 reserved, u64 size; then object 1: u16 index, u16
  // refcount, u32 reserved, u64 size (this file's lengths are 8 bytes).
  const size_t object = gcol + 16;
  ASSERT_EQ(bytes[object], 1);
  const uint64_t huge = 1 << 18;
  std::memcpy(&bytes[object + 8], &huge, 8);
  { std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size()); }
  try {
    ResultsFile::open(path);
    ADD_FAILURE() << "corrupt global heap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt HDF5 global heap at byte " + std::to_string(gcol)), std::string::npos)
        << e.what();
  }
  fs::remove_all(path.parent_path());
}
}  // namespace
}  // namespace kvlab
