// kvlab model-info PATH: what a model file holds. Prints the format, architecture, hyper-
// parameters, the shape and dtype of every kind of weight, the parameter count, the maximum
// context and the KV-cache bytes per token (2 x layers x KV heads x head dim x bytes per element)
// for each KV dtype. --metadata also lists a GGUF file's metadata; --json prints one JSON object.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "framework/cli/options.h"
#include "framework/core/error.h"
#include "framework/model/gguf.h"
#include "framework/model/model.h"
#include "framework/model/model_registry.h"

namespace kvlab::cli {

namespace {

std::string shape(const WeightView& w) { return str_cat("[", w.rows, ", ", w.cols, "]"); }

std::string human(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.2f K", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

int run_model_info(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()
      ("model", po::value<std::string>()->required(),
       "*.gguf | Hugging Face directory | llama2.c *.bin | a registered name (kvlab models)")
      ("tokenizer,t", po::value<std::string>(), "tokenizer file to use instead of the model's own")
      ("metadata", "also list every GGUF metadata key (GGUF files only)")
      ("json", "print one JSON object instead of text");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse_options(args, "kvlab model-info PATH [--metadata] [--json]", desc, pos, vm)) return 0;

  LoadOptions opts;
  if (vm.count("tokenizer")) opts.tokenizer_path = vm["tokenizer"].as<std::string>();
  const std::unique_ptr<Model> model = load_model(resolve_model_path(vm["model"].as<std::string>(), "model-info"), opts);
  const ModelConfig& c = model->config;
  const LayerWeights& l0 = model->layers.at(0);
  const int64_t params = parameter_count(*model);

  struct Row { std::string name; const WeightView* w; int count; };
  const std::vector<Row> rows = {
      {"tok_embeddings", &model->tok_embeddings, 1}, {"wq", &l0.wq, c.n_layers},
      {"wk", &l0.wk, c.n_layers},   {"wv", &l0.wv, c.n_layers},   {"wo", &l0.wo, c.n_layers},
      {"w_gate", &l0.w_gate, c.n_layers}, {"w_up", &l0.w_up, c.n_layers},
      {"w_down", &l0.w_down, c.n_layers}, {"lm_head", &model->lm_head, c.tied_embeddings ? 0 : 1}};
  const DType kv_dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0};
  auto kv_bytes = [&](DType t) { return static_cast<int64_t>(c.kv_bytes_per_token(t)); };

  if (vm.count("json")) {
    nlohmann::ordered_json j;
    j["path"] = model->path.string();
    j["format"] = model->format;
    j["arch"] = c.arch;
    j["dim"] = c.dim;
    j["n_layers"] = c.n_layers;
    j["n_heads"] = c.n_heads;
    j["n_kv_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["hidden_dim"] = c.hidden_dim;
    j["vocab_size"] = c.vocab_size;
    j["max_seq_len"] = c.max_seq_len;
    j["rope_theta"] = c.rope_theta;
    j["rope_style"] = rope_style_name(c.rope_style);
    j["rope_scaling"] = c.rope_scaling.type;
    j["rms_eps"] = c.rms_eps;
    j["qkv_bias"] = c.qkv_bias;
    j["qk_norm"] = c.qk_norm;
    j["tied_embeddings"] = c.tied_embeddings;
    j["stored_dtype"] = model->stored_dtype;
    j["parameters"] = params;
    for (const Row& r : rows) {
      if (r.count == 0) continue;
      j["weights"][r.name] = {{"shape", {r.w->rows, r.w->cols}}, {"dtype", dtype_name(r.w->dtype)},
                              {"count", r.count}};
    }
    for (DType t : kv_dtypes) j["kv_bytes_per_token"][dtype_name(t)] = kv_bytes(t);
    j["tokenizer"] = model->tokenizer ? model->tokenizer->kind() : "none";
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::ostringstream out;
  out << "model:          " << model->path.string() << " (" << model->format << ")\n";
  if (model->files.size() > 1) out << "files:          " << model->files.size() << " shards\n";
  out << "architecture:   " << c.arch << "\n";
  out << "dim:            " << c.dim << "\n";
  out << "layers:         " << c.n_layers << "\n";
  out << "heads:          " << c.n_heads << " query, " << c.n_kv_heads << " KV (GQA group "
      << c.n_heads / c.n_kv_heads << "), head dim " << c.head_dim << "\n";
  out << "ffn hidden:     " << c.hidden_dim << "\n";
  out << "vocab:          " << c.vocab_size << "\n";
  out << "max context:    " << c.max_seq_len << " tokens\n";
  out << "rope:           " << rope_style_name(c.rope_style) << ", theta " << c.rope_theta
      << ", scaling " << c.rope_scaling.type;
  if (c.rope_scaling.type != "none") {
    out << " (factor " << c.rope_scaling.factor;
    if (c.rope_scaling.type == "llama3" && c.rope_freq_factors.empty()) {
      out << ", low " << c.rope_scaling.low_freq_factor << ", high " << c.rope_scaling.high_freq_factor
          << ", original context " << c.rope_scaling.original_max_position;
    }
    if (!c.rope_freq_factors.empty()) out << ", from rope_freqs.weight";
    out << ")";
  }
  out << "\n";
  out << "rms eps:        " << c.rms_eps << "\n";
  out << "qkv bias:       " << (c.qkv_bias ? "yes" : "no") << "\n";
  if (c.qk_norm) out << "qk norm:        per head, before RoPE (Qwen3)\n";
  out << "embeddings:     " << (c.tied_embeddings ? "tied (lm_head = tok_embeddings)" : "untied") << "\n";
  if (c.sliding_window > 0) out << "sliding window: " << c.sliding_window << " (config; informative)\n";
  out << "weights dtype:  " << model->stored_dtype << "\n";
  out << "parameters:     " << params << " (" << human(static_cast<double>(params)) << ")\n";
  out << "weights:\n";
  for (const Row& r : rows) {
    if (r.count == 0) continue;
    char line[160];
    std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", r.name.c_str(), shape(*r.w).c_str(),
                  dtype_name(r.w->dtype), r.count);
    out << line;
  }
  char line[160];
  std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", "norms", str_cat("[", c.dim, "]").c_str(),
                "f32", 2 * c.n_layers + 1);
  out << line;
  if (c.qkv_bias) {
    std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", "bq, bk, bv",
                  str_cat("[", c.n_heads * c.head_dim, "], [", c.n_kv_heads * c.head_dim, "] x2").c_str(),
                  "f32", c.n_layers);
    out << line;
  }
  out << "KV bytes/token: ";
  for (DType t : kv_dtypes) {
    const int64_t b = kv_bytes(t);
    out << (t == DType::kF32 ? "" : ", ") << dtype_name(t) << " " << b;
  }
  out << "  (2 x " << c.n_layers << " layers x " << c.n_kv_heads << " KV heads x " << c.head_dim
      << " head dim x bytes per element)\n";
  out << "KV at max ctx:  f16 " << human(static_cast<double>(c.kv_bytes_per_token(DType::kF16)) * c.max_seq_len)
      << "B\n";
  if (model->tokenizer) {
    out << "tokenizer:      " << model->tokenizer->kind() << ", " << model->tokenizer->vocab_size()
        << " tokens (" << model->tokenizer_search << ")\n";
  } else {
    out << "tokenizer:      none (looked for " << model->tokenizer_search << ")\n";
  }
  if (vm.count("metadata")) {
    if (model->format != "gguf") fail(model->path.string(), ": --metadata needs a GGUF file");
    const GgufFile gguf = GgufFile::open(model->path);
    out << "metadata (GGUF v" << gguf.version() << ", " << gguf.metadata().size() << " keys, "
        << gguf.tensors().size() << " tensors):\n";
    for (const GgufValue& v : gguf.metadata()) {
      out << "  " << v.key() << " = " << v.to_string() << "\n";
    }
  }
  std::cout << out.str();
  return 0;
}

}  // namespace kvlab::cli
