#include "framework/experiment/results.h"

#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace kvlab
