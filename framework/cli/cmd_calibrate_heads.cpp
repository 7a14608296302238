// kvlab calibrate-heads MODEL --haystack FILE -o HEADS.tsv: the retrieval score of every
// (layer, KV head) from NIAH trials under full attention (evals/retrieval_heads.h, Wu et al.),
// written as the head file of the `duo` policy (policies/duo_heads.h). The engine runs the
// TopKeyProbe policy (policies/top_key_probe.h): full attention that records each query head's
// most-attended key for the last row of every call. Prints the per-query-head scores and the
// pairs that retrieval_fraction 0.25 / 0.5 would make retrieval heads.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "evals/niah.h"
#include "evals/retrieval_heads.h"
#include "framework/cli/model_options.h"
#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/experiment/engine_lm.h"
#include "framework/model/model.h"
#include "framework/tokenizer/tokenizer.h"
#include "policies/duo_heads.h"
#include "policies/top_key_probe.h"

namespace kvlab::cli {

namespace {

// "256,512" -> {256, 512}; Error naming the option on anything else.
template <typename T>
std::vector<T> parse_list(const std::string& text, const char* option) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::stringstream is(item);
    T v{};
    if (!(is >> v) || !is.eof()) fail(option, ": '", item, "' is not a number (expected e.g. ", option, " 256,512)");
    out.push_back(v);
  }
  if (out.empty()) fail(option, ": empty list");
  return out;
}

// The probe's record as the calibration's TopKeySource; checks that every layer's record is
// of the same (the latest) call.
class ProbeSource final : public TopKeySource {
 public:
  ProbeSource(std::shared_ptr<TopKeyRecord> rec, int n_kv_heads) : rec_(std::move(rec)), n_kv_(n_kv_heads) {}
  int n_layers() const override { return rec_->n_layers; }
  int n_heads() const override { return rec_->n_heads; }
  int n_kv_heads() const override { return n_kv_; }
  std::vector<int64_t> top_positions() const override {
    for (int64_t p : rec_->row_position)
      if (p != rec_->row_position[0] || p < 0) fail("calibrate-heads: the probe missed a layer of the latest step");
    return rec_->top;
  }

 private:
  std::shared_ptr<TopKeyRecord> rec_;
  int n_kv_;
};

}  // namespace

int run_calibrate_heads(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("haystack", po::value<std::string>()->required(), "UTF-8 text the NIAH prompts are cut from")
      ("output,o", po::value<std::string>()->required(), "head file to write (the duo policy's `heads`)")
      ("lengths", po::value<std::string>()->default_value("256,512,1024"), "context lengths, comma-separated")
      ("depths", po::value<std::string>()->default_value("0,10,20,30,40,50,60,70,80,90,100"),
       "needle depths in percent, comma-separated")
      ("trials", po::value<int>()->default_value(1), "trials per (length, depth)")
      ("seed", po::value<uint64_t>()->default_value(1), "seed of the trials' values and haystack offsets")
      ("value-digits", po::value<int>()->default_value(7), "digits of the needle's value");
  add_model_options(desc);
  po::variables_map vm;
  if (!parse_options(args, "kvlab calibrate-heads MODEL --haystack FILE -o HEADS.tsv [--lengths 256,512] [--depths 0,50,100] [options]",
                     desc, {{"model", 1}}, vm))
    return 0;
  RetrievalCalibrationOptions o;
  o.context_lengths = parse_list<int>(vm["lengths"].as<std::string>(), "--lengths");
  o.depths = parse_list<double>(vm["depths"].as<std::string>(), "--depths");
  for (double d : o.depths)
    if (!(d >= 0 && d <= 100)) fail("--depths: ", d, " is not a percentage in [0, 100]");
  o.trials = vm["trials"].as<int>();
  if (o.trials < 1) fail("--trials must be >= 1, got ", o.trials);
  o.seed = vm["seed"].as<uint64_t>();
  o.niah.value_digits = vm["value-digits"].as<int>();
  if (o.niah.value_digits < 1 || o.niah.value_digits > 32) fail("--value-digits must be in 1..32, got ", o.niah.value_digits);
  const std::string hay_path = vm["haystack"].as<std::string>(), out_path = vm["output"].as<std::string>();
  // Before the trials: a head file that cannot be written should not cost the calibration.
  const std::filesystem::path out_dir = std::filesystem::path(out_path).parent_path();
  const std::string dir = out_dir.empty() ? std::string(".") : out_dir.string();
  if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
    fail(out_path, ": cannot write the head file (", dir, " is not a writable directory)");

  const std::unique_ptr<Model> model = load_model_from_options(vm);
  const ModelConfig& c = model->config;
  for (int len : o.context_lengths)
    if (len < 2 || len > c.max_seq_len)
      fail("--lengths: ", len, " is outside 2..", c.max_seq_len, " (the model's context)");
  const Tokenizer& tok = model->require_tokenizer();
  const Haystack hay = make_haystack(tok, read_input_file(hay_path, "haystack file"));

  EngineOptions opts;
  opts.threads = vm["threads"].as<int>();
  apply_device_options(vm, opts);
  Engine engine(*model, opts);
  auto record = std::make_shared<TopKeyRecord>();
  record->n_layers = c.n_layers;  // (each probe sizes it again for its sequence)
  record->n_heads = c.n_heads;
  record->clear();
  const PolicyModelShape shape = policy_shape(c);
  EngineLm lm(engine, [record, shape] { return std::make_unique<TopKeyProbe>(record, shape); });
  ProbeSource source(record, c.n_kv_heads);
  const bool tty = isatty(fileno(stderr));
  o.on_trial = [tty](int done, int total) {
    if (tty || done == total || done % 10 == 0)
      std::fprintf(stderr, tty ? "\r[%d / %d trials]" : "[%d / %d trials]\n", done, total);
  };
  const RetrievalCalibration r = calibrate_retrieval_heads(lm, source, tok, hay, o);
  if (tty) std::fprintf(stderr, "\n");

  HeadScores scores{c.n_layers, c.n_kv_heads, r.kv_score};
  std::string model_name = vm["model"].as<std::string>();
  model_name = model_name.substr(model_name.find_last_of('/') == std::string::npos ? 0 : model_name.find_last_of('/') + 1);
  auto join = [](const auto& v) {
    std::ostringstream s;
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
    return s.str();
  };
  write_head_file(out_path, scores,
                  {str_cat("model=", model_name, " layers=", c.n_layers, " heads=", c.n_heads, " kv_heads=", c.n_kv_heads),
                   str_cat("retrieval score (Wu et al. 2404.15574): hits / copy tokens, max over a KV head's query heads; ",
                           "haystack=", hay_path, " lengths=", join(o.context_lengths), " depths=", join(o.depths),
                           " trials=", o.trials, " seed=", o.seed, " value_digits=", o.niah.value_digits),
                   str_cat("trials=", r.trials, " correct=", r.correct, " copy_tokens=", r.copy_tokens)});

  std::printf("%d trials, %d answered correctly (full attention), %lld copy tokens\n", r.trials, r.correct,
              static_cast<long long>(r.copy_tokens));
  std::printf("layer  head  kv_head  hits  score\n");
  const int group = c.n_heads / c.n_kv_heads;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_heads; ++h)
      std::printf("%5d  %4d  %7d  %4lld  %.4f\n", l, h, h / group,
                  static_cast<long long>(r.hits[size_t(l) * c.n_heads + h]), r.head_score[size_t(l) * c.n_heads + h]);
  for (double f : {0.25, 0.5}) {
    const std::vector<uint8_t> mask = top_fraction_heads(scores, f);
    std::printf("retrieval_fraction %.2f -> retrieval heads (layer/kv_head):", f);
    for (size_t i = 0; i < mask.size(); ++i)
      if (mask[i]) std::printf(" %zu/%zu", i / c.n_kv_heads, i % c.n_kv_heads);
    std::printf("\n");
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace kvlab::cli
