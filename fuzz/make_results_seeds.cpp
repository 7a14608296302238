// Writes the seed corpus of fuzz_results with kvlab's own results writer (results.h): a small
// experiment's file as `kvlab run` lays it out (root attributes, runs with typed parameters, NIAH
// and perplexity cells, summaries), one shard of a grid experiment and a file with no runs.
// Usage: make_results_seeds OUTDIR (fuzz/make_corpus.py runs it). Deterministic: fixed times.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "framework/core/error.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/experiment.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"

namespace {

using namespace kvlab;

// Small on purpose (every HDF5 object costs ~1 KB, and libFuzzer mutates the whole file).
const char* kYaml = R"(name: seed
model: {path: model.gguf}
policies:
  - {name: full, type: full}
seeds: [0, 1]
evals:
  niah: {haystack: h.txt, context_lengths: [64], depths: [50], trials: 1}
  perplexity: {text: t.txt, tokens: 32}
)";
const char* kGridYaml = R"(name: grid
model: {path: model.gguf}
policies:
  - {name: window, type: sliding_window, params: {window: [64, 128]}}
evals:
  niah: {haystack: h.txt, context_lengths: [64], depths: [0, 50]}
)";
Dataset column(auto values) {
  Dataset d;
  d.data = std::move(values);
  return d;
}

CellRecord niah_cell(int64_t length, double depth) {
  CellRecord r;
  r.attrs = {{"context_length", length}, {"depth", depth}, {"trials", int64_t{2}}, {"accuracy", 0.5},
             {"prefill_s", 0.01}, {"kv_bytes_peak", int64_t{4096}}, {"recall_mean", 0.9},
             {"finished_at", std::string("2026-01-01T00:00:00Z")}};
  r.datasets["values"] = column(std::vector<std::string>{"1234567", "7654321"});
  r.datasets["answers"] = column(std::vector<std::string>{" 1234567", " 42"});
  r.datasets["correct"] = column(std::vector<int8_t>{1, 0});
  r.datasets["first_wrong_token"] = column(std::vector<int64_t>{3, 1});
  r.datasets["value_logprob"] = column(std::vector<double>{-0.5, NAN});
  r.datasets["needle_pos"] = column(std::vector<int64_t>{10, 20});
  r.datasets["kv_bytes_peak"] = column(std::vector<int64_t>{4096, 8192});
  r.datasets["recall_mean"] = column(std::vector<double>{0.9, 0.8});
  r.datasets["status"] = column(std::vector<std::string>{"ok", "ok"});
  Dataset grid = column(std::vector<float>{1, 2, 3, 4, 5, 6});
  grid.shape = {2, 3};
  grid.attrs = {{"unit", std::string("nats")}};
  r.datasets["attention_recall_per_layer"] = grid;
  return r;
}

CellRecord ppl_cell() {
  CellRecord r;
  r.attrs = {{"text", std::string("t.txt")}, {"protocol", std::string("streaming")}, {"tokens", int64_t{32}},
             {"n_scored", int64_t{4}}, {"ppl", 12.5}, {"ppl_stderr", 1.5}, {"status", std::string("ok")}};
  Dataset nll = column(std::vector<float>{2.5f, 2.4f, 2.6f, 2.5f});
  nll.attrs = {{"unit", std::string("nats")}};
  r.datasets["nll"] = nll;
  r.datasets["positions"] = column(std::vector<int64_t>{1, 2, 3, 4});
  r.datasets["checkpoints"] = column(std::vector<int64_t>{2, 4});
  r.datasets["running_ppl"] = column(std::vector<double>{12.0, 12.5});
  return r;
}

void write_seed(const std::filesystem::path& path, const char* yaml, bool all_cells, bool summaries) {
  const ExperimentSpec spec = parse_experiment_text(yaml, "seed.yaml");
  const std::vector<RunSpec> runs = expand_runs(spec);
  const std::vector<CellSpec> cells = expand_cells(spec, runs);
  std::filesystem::remove(path);
  ResultsFile file = ResultsFile::create(
      path, {{"kvlab_version", std::string("0.1.0")}, {"git_commit", std::string("seed")},
             {"experiment", std::string(yaml)}, {"experiment_file", std::string("seed.yaml")},
             {"name", std::string("seed")}, {"start_time", std::string("2026-01-01T00:00:00Z")},
             {"seeds", std::vector<int64_t>{0, 1}}, {"cells_total", int64_t(cells.size())},
             {"shard", std::string("0/1")}});
  for (const RunSpec& run : runs) {
    AttrMap a{{"policy_name", run.entry_name}, {"policy_type", run.type}};
    for (const auto& [k, v] : run.params)
      if (auto* i = std::get_if<int64_t>(&v)) a["param." + k] = *i;
    file.ensure_run(run.name, a);
  }
  for (const CellSpec& c : cells) {
    if (!all_cells && c.index % 2 == 1) continue;  // a shard's worth
    const RunSpec& run = runs[c.run];
    file.write_cell(run.name, c.id,
                    spec.evals[c.eval]->name() == "niah"
                        ? niah_cell(niah_spec(spec).context_lengths[c.eval_cell / niah_spec(spec).depths.size()],
                                    niah_spec(spec).depths[c.eval_cell % niah_spec(spec).depths.size()])
                        : ppl_cell());
  }
  if (summaries) write_summaries(file, spec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_results_seeds OUTDIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    write_seed(dir / "complete.h5", kYaml, true, true);
    write_seed(dir / "shard.h5", kGridYaml, false, false);
    ResultsFile::create(dir / "empty.h5", {{"name", std::string("empty")}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_results_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
