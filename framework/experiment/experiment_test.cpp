#include "framework/experiment/experiment.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/runner.h"
#include "framework/model/model.h"
#include "framework/policy/policy.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

const char* kValid = R"(
name: demo
model:
  path: models/tiny.gguf
  dtype: f32
  threads: 2
kv: {block_size: 8, budget_bytes: 64MiB, block_tables: per_head}
engine: {prefill_chunk: 128, probe: false, probe_layers: [0, 1]}
policies:
  - {name: full, type: full}
  - name: win
    type: window
    params: {window: [32, 64], sinks: 4}
  - name: h2o
    type: h2o
    params: {heavy: [8, 16], recent: [8, 16], label: "007"}
seeds: [3, 4]
evals:
  niah:
    haystack: [a.txt, b.txt]
    context_lengths: [256, 512]
    depths: [0, 50, 100]
    trials: 2
    value_digits: 5
    needle_placement: previous
    decode_tail_tokens: 4
  perplexity:
    text: t.txt
    tokens: 1024
    protocol: sliding
    window: 256
    stride: 128
)";

TEST(Experiment, ParsesEveryField) {
  const ExperimentSpec s = parse_experiment_text(kValid, "exp/demo.yaml");
  EXPECT_EQ(s.name, "demo");
  EXPECT_EQ(s.model.path, fs::path("models/tiny.gguf"));  // neither candidate exists: as written
  EXPECT_EQ(s.model.dtype, "f32");
  EXPECT_EQ(s.model.threads, 2);
  EXPECT_EQ(s.kv.block_size_tokens, 8);
  EXPECT_EQ(s.kv.budget_bytes, 64u << 20);
  EXPECT_TRUE(s.kv.per_head_tables);
  EXPECT_FALSE(parse_experiment_text("model: {path: m.gguf}\npolicies: [{type: full}]\nevals: {perplexity: {text: t.txt}}\n",
                                     "default.yaml").kv.per_head_tables);
  EXPECT_EQ(s.engine.prefill_chunk_tokens, 128);
  EXPECT_FALSE(s.engine.probe);
  EXPECT_EQ(s.engine.probe_layers, (std::vector<int>{0, 1}));
  ASSERT_EQ(s.policies.size(), 3u);
  EXPECT_EQ(s.policies[1].name, "win");
  EXPECT_EQ(s.policies[1].params[0].first, "window");
  EXPECT_EQ(s.policies[1].params[0].second.size(), 2u);
  // Quoted scalars stay strings, plain ones are typed.
  EXPECT_EQ(std::get<std::string>(s.policies[2].params[2].second[0]), "007");
  EXPECT_EQ(std::get<int64_t>(s.policies[1].params[1].second[0]), 4);
  EXPECT_EQ(s.seeds, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(s.output, fs::path("results/demo.h5"));
  EXPECT_TRUE(niah_spec(s).enabled);
  EXPECT_EQ(niah_spec(s).haystack.size(), 2u);
  EXPECT_EQ(niah_spec(s).context_lengths, (std::vector<int>{256, 512}));
  EXPECT_EQ(niah_spec(s).depths, (std::vector<double>{0, 50, 100}));
  EXPECT_EQ(niah_spec(s).trials, 2);
  EXPECT_EQ(niah_spec(s).value_digits, 5);
  EXPECT_EQ(niah_spec(s).decode_tail_tokens, 4);
  EXPECT_EQ(niah_spec(s).needle, "The special magic number is {value}.");
  EXPECT_EQ(niah_spec(s).needle_placement, NeedlePlacement::kPrevious);
  // Unwritten, the needle goes to the nearest sentence boundary.
  EXPECT_EQ(niah_spec(parse_experiment_text("model: {path: m.gguf}\npolicies: [{type: full}]\nevals: {niah: {haystack: h.txt, "
                                            "context_lengths: [256], depths: [50]}}\n", "d.yaml"))
                .needle_placement,
            NeedlePlacement::kNearest);
  EXPECT_TRUE(perplexity_spec(s).enabled);
  EXPECT_EQ(perplexity_spec(s).protocol, PplProtocol::kSliding);
  EXPECT_EQ(perplexity_spec(s).window, 256);
  EXPECT_EQ(perplexity_spec(s).stride, 128);
  EXPECT_EQ(s.yaml_text, kValid);
}

TEST(Experiment, GridExpandsInFileOrderLastFastest) {
  const ExperimentSpec s = parse_experiment_text(kValid, "demo.yaml");
  const std::vector<RunSpec> runs = expand_runs(s);
  std::vector<std::string> names;
  for (const auto& r : runs) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"full", "win@window=32", "win@window=64",
                                             "h2o@heavy=8,recent=8", "h2o@heavy=8,recent=16",
                                             "h2o@heavy=16,recent=8", "h2o@heavy=16,recent=16"}));
  EXPECT_EQ(std::get<int64_t>(runs[2].params.at("window")), 64);
  EXPECT_EQ(std::get<int64_t>(runs[2].params.at("sinks")), 4);
  EXPECT_EQ(runs[5].type, "h2o");

  const std::vector<CellSpec> cells = expand_cells(s, runs);
  ASSERT_EQ(cells.size(), runs.size() * (2 * 3 + 1));
  EXPECT_EQ(cells[0].id, "niah_L256_D0");
  EXPECT_EQ(cells[4].id, "niah_L512_D50");
  EXPECT_EQ(cells[6].id, "ppl_T0");
  EXPECT_EQ(cells[7].run, 1);
  for (size_t i = 0; i < cells.size(); ++i) EXPECT_EQ(cells[i].index, int(i));
}

// kv.format as a grid axis: every policy run once per format, formats outermost, the format a
// last listed key of the run's name; one format (a scalar or a one-element list) leaves the names
// as they were.
TEST(Experiment, KvFormatListIsAGridAxis) {
  const std::string base = "model: {path: m.gguf}\npolicies:\n  - {name: full, type: full}\n"
                           "  - {name: win, type: window, params: {window: [32, 64]}}\n"
                           "evals: {perplexity: {text: t.txt}}\n";
  const ExperimentSpec s = parse_experiment_text(base + "kv: {format: [f32, int4]}\n", "grid.yaml");
  ASSERT_EQ(s.kv.formats, (std::vector<std::string>{"f32", "int4"}));
  EXPECT_EQ(count_grid(s).runs, 6u);
  const std::vector<RunSpec> runs = expand_runs(s);
  std::vector<std::string> names, formats;
  for (const auto& r : runs) {
    names.push_back(r.name);
    formats.push_back(r.kv_format);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"full@kv.format=f32", "win@window=32,kv.format=f32",
                                             "win@window=64,kv.format=f32", "full@kv.format=int4",
                                             "win@window=32,kv.format=int4", "win@window=64,kv.format=int4"}));
  EXPECT_EQ(formats, (std::vector<std::string>{"f32", "f32", "f32", "int4", "int4", "int4"}));
  for (const char* one : {"kv: {format: int8}\n", "kv: {format: [int8]}\n"}) {
    const ExperimentSpec t = parse_experiment_text(base + one, "one.yaml");
    const std::vector<RunSpec> r = expand_runs(t);
    ASSERT_EQ(r.size(), 3u) << one;
    EXPECT_EQ(r[1].name, "win@window=32") << one;
    EXPECT_EQ(r[1].kv_format, "int8") << one;
  }
  EXPECT_EQ(expand_runs(parse_experiment_text(base, "default.yaml"))[0].kv_format, "f32");
  const ExperimentSpec fp8 = parse_experiment_text(base + "kv: {format: fp8_e4m3, fp8_scale: prompt}\n", "fp8.yaml");
  EXPECT_TRUE(fp8.kv.fp8_scale_from_prompt);
  const ExperimentSpec fixed = parse_experiment_text(base + "kv: {format: fp8_e4m3, fp8_scale: 0.5}\n", "fp8.yaml");
  EXPECT_FALSE(fixed.kv.fp8_scale_from_prompt);
  EXPECT_EQ(fixed.kv.fp8_scale, 0.5);
}

// zip: the keys of a group step together (one axis of the product, at its first key's place),
// beside the cartesian product of the other lists.
TEST(Experiment, ZippedParametersStepTogether) {
  const std::string head = "model: {path: m.gguf}\nevals: {perplexity: {text: t.txt}}\npolicies:\n";
  const ExperimentSpec s = parse_experiment_text(
      head + "  - name: lm\n    type: landmark\n"
             "    params: {chunk_size: [16, 32, 64], sinks: [0, 4], top_k: [8, 4, 2]}\n"
             "    zip: [chunk_size, top_k]\n",
      "zip.yaml");
  EXPECT_EQ(count_grid(s).runs, 6u);  // 3 zipped steps x 2 sinks, not 3 x 2 x 3
  std::vector<std::string> names;
  for (const auto& r : expand_runs(s)) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "lm@chunk_size=16,sinks=0,top_k=8", "lm@chunk_size=16,sinks=4,top_k=8",
                       "lm@chunk_size=32,sinks=0,top_k=4", "lm@chunk_size=32,sinks=4,top_k=4",
                       "lm@chunk_size=64,sinks=0,top_k=2", "lm@chunk_size=64,sinks=4,top_k=2"}));
  // Two groups, the later key first in its group: the axis sits where its first key is written.
  const ExperimentSpec t = parse_experiment_text(
      head + "  - name: h\n    type: h2o\n"
             "    params: {heavy: [8, 16], recent: [8, 16], sinks: [0, 4], label: [a, b]}\n"
             "    zip: [[recent, heavy], [label, sinks]]\n",
      "zip2.yaml");
  names.clear();
  for (const auto& r : expand_runs(t)) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"h@heavy=8,recent=8,sinks=0,label=a", "h@heavy=8,recent=8,sinks=4,label=b",
                                             "h@heavy=16,recent=16,sinks=0,label=a",
                                             "h@heavy=16,recent=16,sinks=4,label=b"}));
}

TEST(Experiment, ZipErrorsNameTheLine) {
  auto error_of = [](const std::string& policy) {
    try {
      parse_experiment_text("model: {path: m.gguf}\nevals: {perplexity: {text: t.txt}}\npolicies:\n" + policy, "z.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string unequal = error_of("  - name: lm\n    type: landmark\n    params: {chunk_size: [16, 32, 64], top_k: [8, 4]}\n"
                                       "    zip: [chunk_size, top_k]\n");
  EXPECT_NE(unequal.find("z.yaml:7:23: policies[0].zip[1]: zipped parameters step together, so their lists need "
                         "one length: 'top_k' has 2 values, 'chunk_size' has 3"),
            std::string::npos) << unequal;
  const std::string unknown = error_of("  - name: lm\n    type: landmark\n    params: {chunk_size: [16, 32], top_k: [8, 4]}\n"
                                       "    zip: [chunk_size, topk]\n");
  EXPECT_NE(unknown.find("z.yaml:7:23: policies[0].zip[1]: 'topk' is not a parameter of this entry (did you mean 'top_k'?)"),
            std::string::npos) << unknown;
  const std::string twice = error_of("  - name: lm\n    type: landmark\n    params: {chunk_size: [16, 32], top_k: [8, 4], window: [1, 2]}\n"
                                     "    zip: [[chunk_size, top_k], [window, top_k]]\n");
  EXPECT_NE(twice.find("z.yaml:7:41: policies[0].zip[1][1]: parameter 'top_k' is zipped twice"), std::string::npos) << twice;
  const std::string alone = error_of("  - name: lm\n    type: landmark\n    params: {chunk_size: [16, 32]}\n    zip: [chunk_size]\n");
  EXPECT_NE(alone.find("z.yaml:7:10: policies[0].zip: expected a list of at least two parameter names"), std::string::npos) << alone;
  const std::string scalar = error_of("  - name: lm\n    type: landmark\n    params: {chunk_size: [16, 32]}\n    zip: chunk_size\n");
  EXPECT_NE(scalar.find("z.yaml:7:10: policies[0].zip: expected a list of parameter names"), std::string::npos) << scalar;
}

TEST(Experiment, ShardsPartitionTheCells) {
  const ExperimentSpec s = parse_experiment_text(kValid, "demo.yaml");
  const auto cells = expand_cells(s, expand_runs(s));
  std::multiset<int> seen;
  for (int i = 0; i < 3; ++i)
    for (const auto& c : cells)
      if (in_shard(c, Shard{i, 3})) seen.insert(c.index);
  EXPECT_EQ(seen.size(), cells.size());
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), cells.size());
  EXPECT_EQ(parse_shard("2/5").index, 2);
  EXPECT_EQ(parse_shard("2/5").count, 5);
  for (const char* bad : {"5/5", "-1/3", "1/0", "1-3", "1/3x", ""})
    EXPECT_THROW(parse_shard(bad), Error) << bad;
}

TEST(Experiment, TrialSeedsArePureAndDistinct) {
  EXPECT_EQ(trial_seed(1, 512, 50, 0), trial_seed(1, 512, 50, 0));
  std::set<uint64_t> seeds;
  for (uint64_t seed : {0, 1})
    for (int len : {256, 512})
      for (double d : {0.0, 50.0})
        for (int t : {0, 1}) seeds.insert(trial_seed(seed, len, d, t));
  EXPECT_EQ(seeds.size(), 16u);
}

TEST(Experiment, ByteSizes) {
  EXPECT_EQ(parse_byte_size("4096", "x"), 4096u);
  EXPECT_EQ(parse_byte_size("64MiB", "x"), 64u << 20);
  EXPECT_EQ(parse_byte_size("1.5 GB", "x"), 1500000000u);
  EXPECT_THROW(parse_byte_size("12 parsecs", "x"), Error);
  EXPECT_THROW(parse_byte_size("-3", "x"), Error);
}

TEST(Experiment, NearestName) {
  EXPECT_EQ(nearest_name("polices", {"model", "policies", "plugins"}), "policies");
  EXPECT_EQ(nearest_name("zzzzzzzzz", {"model", "policies"}), "");
}

// Each file of testdata/invalid starts with "# expect: MESSAGE"; parsing it must throw a
// kvlab::Error whose message contains MESSAGE (file name, line:column, key path, expectation).
TEST(Experiment, InvalidCorpusGivesTheExpectedMessages) {
  const fs::path dir = fs::path(KVLAB_SOURCE_DIR) / "framework/experiment/testdata/invalid";
  int n_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++n_files;
    std::ifstream in(entry.path());
    std::string first;
    std::getline(in, first);
    const std::string tag = "# expect: ";
    ASSERT_EQ(first.rfind(tag, 0), 0u) << entry.path() << " lacks a '# expect:' first line";
    const std::string expected = first.substr(tag.size());
    try {
      parse_experiment(entry.path());
      ADD_FAILURE() << entry.path().filename() << ": parsed without error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(expected), std::string::npos)
          << entry.path().filename() << "\n  expected: " << expected << "\n  got:      " << msg;
    }
  }
  EXPECT_GE(n_files, 20);
}

// A registry stand-in with one policy type, to check type and parameter validation.
class FakeWindowFactory : public PolicyFactory {
 public:
  std::string name() const override { return "window"; }
  std::string doc() const override { return "test"; }
  const ParamSpecs& params() const override { return specs_; }
  std::unique_ptr<AttentionPolicy> create(const ParamValues&, const PolicyModelShape&) const override {
    return nullptr;
  }

 private:
  ParamSpecs specs_{{"window", ParamType::kInt, int64_t(64), "keys kept", 1.0, std::nullopt, {}}};
};

TEST(Experiment, PolicyTypesAndParamsCheckedAgainstRegistry) {
  FakeWindowFactory window;
  PolicyLookup lookup{[&](const std::string& t) -> const PolicyFactory* {
                        return t == "window" ? &window : nullptr;
                      },
                      [] { return std::vector<std::string>{"window"}; }};
  auto message = [&](const std::string& yaml) {
    try {
      check_policies(parse_experiment_text(yaml, "p.yaml"), lookup);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = "model: {path: m.gguf}\nevals: {perplexity: {text: t.txt}}\npolicies:\n";
  EXPECT_EQ(message(head + "  - {type: window, params: {window: [8, 16]}}\n"), "no error");
  EXPECT_NE(message(head + "  - type: windw\n").find("p.yaml:4:11: policies[0].type: unknown policy "
                                                     "type 'windw' (did you mean 'window'?)"),
            std::string::npos)
      << message(head + "  - type: windw\n");
  const std::string bad_key = message(head + "  - type: window\n    params: {windo: 8}\n");
  EXPECT_NE(bad_key.find("p.yaml:5:13: policies[0].params.windo: unknown parameter of policy "
                         "'window' (did you mean 'window'?)"),
            std::string::npos)
      << bad_key;
  const std::string bad_value = message(head + "  - type: window\n    params: {window: [8, 0]}\n");
  EXPECT_NE(bad_value.find("policies[0].params.window: policy 'window' expects a value in [1, inf], got 0"),
            std::string::npos)
      << bad_value;
}


// Issue 13: the parameter holes in an experiment file, with the built-in policies: each value
// is refused by check_policies at its line; a combination (heavy: 64 with the default ratio
// units) by the model check, at the entry's params line, naming the grid point.
TEST(Experiment, PolicyParameterHolesNameTheLine) {
  PolicyRegistry registry = make_builtin_registry();
  const PolicyLookup lookup{[&](const std::string& t) { return registry.find(t); }, [&] { return registry.names(); }};
  const std::string head = "model: {path: m.gguf}\nevals: {perplexity: {text: t.txt, tokens: 64}}\npolicies:\n";
  auto message = [&](const std::string& policy, const std::string& params, bool with_model) {
    try {
      const ExperimentSpec spec =
          parse_experiment_text(head + "  - type: " + policy + "\n    params: " + params + "\n", "p.yaml");
      check_policies(spec, lookup);
      if (with_model) {
        ModelConfig config;
        config.n_layers = 2, config.n_heads = 4, config.n_kv_heads = 2, config.head_dim = 8, config.max_seq_len = 512;
        check_experiment_against_model(spec, config, registry);
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string int_form = "expects int (decimal digits with an optional sign, at most 2^53 in magnitude";
  const std::string float_form = "expects float (a finite decimal number";
  EXPECT_EQ(message("sliding_window", "{window: [0x10, 16]}", false).find(
                "p.yaml:5:13: policies[0].params.window: policy 'sliding_window' " + int_form), 0u);
  EXPECT_EQ(message("sliding_window", "{window: 1e3}", false).find("p.yaml:5:13: policies[0].params.window"), 0u);
  EXPECT_NE(message("sinks", "{recent: 9223372036854775808}", false).find("(past int64)"), std::string::npos);
  for (const std::string v : {".nan", "nan", ".inf", "-.inf", "inf", "-inf"})
    EXPECT_EQ(message("h2o", "{heavy: " + v + "}", false).find("p.yaml:5:13: policies[0].params.heavy: policy 'h2o' " + float_form), 0u)
        << v << ": " << message("h2o", "{heavy: " + v + "}", false);
  const std::string ratio = message("h2o", "{heavy: [0.1, 64]}", true);
  EXPECT_EQ(ratio.find("p.yaml:5:13: policies[0].params (run h2o@heavy=64): policy 'h2o': heavy = 64 with units: "
                       "ratio (the default): a ratio must be in [0, 1]"), 0u) << ratio;
  EXPECT_EQ(message("h2o", "{heavy: 64, recent: 64, units: tokens}", true), "no error");
  EXPECT_EQ(message("landmark", "{gqa: per_head, compression_ratio: 0.75}", true), "no error");
}

// Issue 11: a 5 KB file whose grid lists share one 1000-value list through an alias asked
// `validate` to expand 10^9 runs. Cells are counted from the list lengths first.
std::string shared_list_grid(int values, const std::string& extra = "") {
  std::string list;
  for (int i = 0; i < values; ++i) list += (i ? ", " : "") + std::to_string(64 + i);
  return "model: {path: m.gguf}\n" + extra +
         "policies:\n"
         "  - {name: lm, type: landmark, params: {chunk_size: &v [" + list + "], top_k: *v, window: *v}}\n"
         "evals: {niah: {haystack: h.txt, context_lengths: [64], depths: [50]}}\n";
}

TEST(ExperimentLimits, GridSharingOneListThroughAnAliasIsCountedAndRefused) {
  const std::string yaml = shared_list_grid(1000);
  EXPECT_LT(yaml.size(), 6000u);
  try {
    parse_experiment_text(yaml, "grid.yaml");
    ADD_FAILURE() << "10^9 cells accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("grid.yaml:3:"), std::string::npos) << m;
    EXPECT_NE(m.find("policies[0].params: the experiment expands to 1000000000 runs x 1 cells per run = "
                     "1000000000 cells, above max_cells = 1000000 (the default; set max_cells: N"),
              std::string::npos) << m;
  }
}

TEST(ExperimentLimits, MaxCellsIsSettableAndChecksTheEvalsToo) {
  // 20^3 = 8000 runs: past max_cells: 1000, within the default.
  EXPECT_EQ(count_grid(parse_experiment_text(shared_list_grid(20), "g.yaml")).cells, 8000u);
  try {
    parse_experiment_text(shared_list_grid(20, "max_cells: 1000\n"), "g.yaml");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("above max_cells = 1000 (set at g.yaml:2:12: max_cells"), std::string::npos)
        << e.what();
  }
  // Lengths x depths alone: named by the NIAH section.
  std::string lengths, depths;
  for (int i = 0; i < 2000; ++i) lengths += (i ? ", " : "") + std::to_string(16 + i);
  for (int i = 0; i < 1000; ++i) depths += (i ? ", " : "") + std::to_string(i / 10.0);
  const std::string niah = "model: {path: m.gguf}\npolicies: [{type: full}]\n"
                           "evals:\n  niah: {haystack: h.txt, context_lengths: [" + lengths + "], depths: [" +
                           depths + "]}\n";
  try {
    parse_experiment_text(niah, "n.yaml");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n.yaml:4:9: evals.niah: the experiment expands to 1 runs x 2000000 cells"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(count_grid(parse_experiment_text("max_cells: 2000000\n" + niah, "n.yaml")).cells, 2000000u);
  // Out of range values of max_cells itself.
  for (const char* v : {"0", "-1", "2147483648", "1e9"}) {
    try {
      parse_experiment_text(std::string("max_cells: ") + v + "\n" + niah, "n.yaml");
      ADD_FAILURE() << v;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_cells: expected an integer"), std::string::npos) << e.what();
    }
  }
  // Built in code: expand_runs checks too.
  ExperimentSpec spec = parse_experiment_text(shared_list_grid(20), "g.yaml");
  spec.max_cells = 100;
  EXPECT_THROW(expand_runs(spec), Error);
}

TEST(ExperimentLimits, OverlongPathComponentIsAnErrorNotAFilesystemException) {
  // resolve_path's std::filesystem::exists threw filesystem_error (File name too long).
  const std::string name(300, 'x');
  const ExperimentSpec spec = parse_experiment_text(
      "model: {path: " + name + "/m.gguf}\npolicies: [{type: full}]\nevals: {perplexity: {text: t.txt}}\n",
      "long.yaml");
  EXPECT_EQ(spec.model.path, fs::path(name + "/m.gguf"));
  try {
    check_files_exist(spec);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("long.yaml: model.path: cannot access " + name), std::string::npos) << e.what();
  }
}

TEST(ExperimentLimits, ByteSizesPastUint64AreRefused) {
  EXPECT_EQ(parse_byte_size("4GiB", "kv"), uint64_t{4} << 30);
  for (const char* text : {"1e300", "1e30GB", "9223372036854775808"}) {
    try {
      parse_byte_size(text, "kv.budget_bytes");
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kv.budget_bytes: byte size"), std::string::npos) << e.what();
    }
  }
}
}  // namespace
}  // namespace kvlab
