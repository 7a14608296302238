// kvlab model-info PATH: what a model file holds. Prints the format, architecture, hyper-
// parameters, the shape and dtype of every kind of weight, the parameter count, the maximum
// context and the KV-cache bytes per token (2 x layers x KV heads x head dim x bytes per element)
// for each KV dtype, and each tensor type's share (tensor count and bytes: from the file's tensor
// table for GGUF, where types mix per tensor, else from the loaded weights). --metadata also lists a GGUF file's metadata; --json prints one JSON object.
#include <algorithm>
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

// Tensor type -> {count, bytes}, in first-seen order.
struct TypeShare {
  std::string type;
  int64_t count = 0;
  int64_t bytes = 0;
};

std::vector<TypeShare> tensor_type_shares(const Model& m) {
  std::vector<TypeShare> out;
  auto add = [&](const std::string& type, int64_t bytes, int64_t count) {
    auto it = std::find_if(out.begin(), out.end(), [&](const TypeShare& s) { return s.type == type; });
    if (it == out.end()) it = out.insert(out.end(), TypeShare{type});
    it->count += count;
    it->bytes += bytes * count;
  };
  if (m.format == "gguf") {
    const GgufFile file = GgufFile::open(m.path);
    for (const GgufTensorInfo& t : file.tensors())
      add(ggml_type_name(static_cast<uint32_t>(t.type)), static_cast<int64_t>(t.n_bytes), 1);
    return out;
  }
  auto view = [&](const WeightView& w) {
    add(dtype_name(w.dtype), static_cast<int64_t>(w.row_bytes()) * w.rows, 1);
  };
  view(m.tok_embeddings);
  if (!m.config.tied_embeddings) view(m.lm_head);
  for (const LayerWeights& l : m.layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.wq_a, &l.wq_b,
                                &l.wkv_a, &l.wkv_b})
      if (w->rows > 0) view(*w);
  add("f32", m.config.dim * 4, 2 * m.config.n_layers + 1);  // the norms, kept in fp32
  return out;
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
  po::variables_map vm;
  if (!parse_options(args, "kvlab model-info PATH [--metadata] [--json]", desc, {{"model", 1}}, vm)) return 0;

  LoadOptions opts;
  if (vm.count("tokenizer")) opts.tokenizer_path = vm["tokenizer"].as<std::string>();
  const std::unique_ptr<Model> model = load_model(resolve_model_path(vm["model"].as<std::string>(), "model-info"), opts);
  const ModelConfig& c = model->config;
  const LayerWeights& l0 = model->layers.at(0);
  const int64_t params = parameter_count(*model);

  // Layer matrices carry their member so that their dtype is read over all layers ("q4_k/q6_k"
  // when a file mixes them per layer, as llama.cpp's Q4_K_M does for attn_v and ffn_down).
  struct Row { std::string name; const WeightView* w; int count; WeightView LayerWeights::*member = nullptr; };
  auto layer_row = [&](const char* name, WeightView LayerWeights::*member) {
    return Row{name, &(l0.*member), (l0.*member).rows > 0 ? c.n_layers : 0, member};
  };
  const std::vector<Row> rows = {
      {"tok_embeddings", &model->tok_embeddings, 1}, layer_row("wq", &LayerWeights::wq),
      layer_row("wk", &LayerWeights::wk), layer_row("wv", &LayerWeights::wv), layer_row("wo", &LayerWeights::wo),
      layer_row("w_gate", &LayerWeights::w_gate), layer_row("w_up", &LayerWeights::w_up),
      layer_row("w_down", &LayerWeights::w_down), layer_row("wq_a", &LayerWeights::wq_a),
      layer_row("wq_b", &LayerWeights::wq_b), layer_row("wkv_a", &LayerWeights::wkv_a),
      layer_row("wkv_b", &LayerWeights::wkv_b), {"lm_head", &model->lm_head, c.tied_embeddings ? 0 : 1}};
  auto row_dtype = [&](const Row& r) {
    if (r.member == nullptr) return std::string(dtype_name(r.w->dtype));
    std::string out;
    for (const LayerWeights& l : model->layers) {
      const std::string name = dtype_name((l.*r.member).dtype);
      if (("/" + out + "/").find("/" + name + "/") == std::string::npos) out += (out.empty() ? "" : "/") + name;
    }
    return out;
  };
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
    const int n_local = static_cast<int>(std::count(c.local_layers.begin(), c.local_layers.end(), 1));
    j["sliding_window"] = c.sliding_window;
    j["local_layers"] = n_local;  // layers reading only the last sliding_window positions
    j["attention_scale"] = attention_scale(c);
    j["attn_softcap"] = c.attn_softcap;
    j["final_softcap"] = c.final_softcap;
    j["tied_embeddings"] = c.tied_embeddings;
    j["stored_dtype"] = model->stored_dtype;
    j["parameters"] = params;
    for (const Row& r : rows) {
      if (r.count == 0) continue;
      j["weights"][r.name] = {{"shape", {r.w->rows, r.w->cols}}, {"dtype", row_dtype(r)},
                              {"count", r.count}};
    }
    for (const TypeShare& t : tensor_type_shares(*model))
      j["tensor_types"][t.type] = {{"count", t.count}, {"bytes", t.bytes}};
    for (DType t : kv_dtypes) j["kv_bytes_per_token"][dtype_name(t)] = kv_bytes(t);
    if (c.mla()) {
      j["mla"] = {{"q_lora_rank", c.q_lora_rank}, {"kv_lora_rank", c.kv_lora_rank},
                  {"qk_nope_head_dim", c.qk_nope_head_dim}, {"qk_rope_head_dim", c.qk_rope_head_dim},
                  {"v_head_dim", c.v_head_dim}};
      for (DType t : kv_dtypes)
        j["mha_kv_bytes_per_token"][dtype_name(t)] = static_cast<int64_t>(c.mha_kv_bytes_per_token(t));
    }
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
  if (c.qk_norm) out << "qk norm:        per head, before RoPE\n";
  if (c.mla())
    out << "attention:      multi-head latent (MLA), q_lora_rank " << c.q_lora_rank << ", kv_lora_rank "
        << c.kv_lora_rank << ", qk_nope " << c.qk_nope_head_dim << ", qk_rope " << c.qk_rope_head_dim << ", v "
        << c.v_head_dim << "; run absorbed: 1 latent KV head of " << c.head_dim << "\n";
  out << "embeddings:     " << (c.tied_embeddings ? "tied (lm_head = tok_embeddings)" : "untied")
      << (c.embed_scale ? ", scaled by sqrt(dim)" : "") << "\n";
  if (!c.local_layers.empty()) {
    const int n_local = static_cast<int>(std::count(c.local_layers.begin(), c.local_layers.end(), 1));
    out << "layer kinds:    " << n_local << " local (window " << c.sliding_window << " tokens";
    if (c.rope_local_theta > 0) out << ", rope theta " << c.rope_local_theta << ", unscaled";
    out << "), " << c.n_layers - n_local << " global\n";
  } else if (c.sliding_window > 0) {
    out << "sliding window: " << c.sliding_window << " (config; informative)\n";
  }
  if (c.sandwich_norms)
    out << "block:          Gemma (post-attention and post-FFN norms, "
        << (c.ffn_activation == FfnActivation::kGeluTanh ? "GeGLU tanh" : "SwiGLU") << ")\n";
  if (c.query_scale > 0)
    out << "score scale:    " << attention_scale(c)
        << (c.mla() ? " (1/sqrt(qk_nope + qk_rope))\n" : " (query_pre_attn_scalar^-1/2)\n");
  if (c.attn_softcap > 0 || c.final_softcap > 0)
    out << "soft-capping:   attention " << c.attn_softcap << ", final logits " << c.final_softcap << "\n";
  out << "weights dtype:  " << model->stored_dtype << "\n";
  out << "parameters:     " << params << " (" << human(static_cast<double>(params)) << ")\n";
  out << "weights:\n";
  for (const Row& r : rows) {
    if (r.count == 0) continue;
    char line[160];
    std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", r.name.c_str(), shape(*r.w).c_str(),
                  row_dtype(r).c_str(), r.count);
    out << line;
  }
  char line[160];
  std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", "norms", str_cat("[", c.dim, "]").c_str(),
                "f32", (c.sandwich_norms ? 4 : 2) * c.n_layers + 1);
  out << line;
  if (c.qkv_bias) {
    std::snprintf(line, sizeof line, "  %-15s %-14s %-5s x %d\n", "bq, bk, bv",
                  str_cat("[", c.n_heads * c.head_dim, "], [", c.n_kv_heads * c.head_dim, "] x2").c_str(),
                  "f32", c.n_layers);
    out << line;
  }
  {
    const std::vector<TypeShare> shares = tensor_type_shares(*model);
    int64_t total = 0;
    for (const TypeShare& t : shares) total += t.bytes;
    out << "tensor types:  ";
    for (const TypeShare& t : shares) {
      char share[160];
      std::snprintf(share, sizeof share, " %s %lld tensors %sB (%.1f%%)", t.type.c_str(),
                    static_cast<long long>(t.count), human(static_cast<double>(t.bytes)).c_str(),
                    total > 0 ? 100.0 * static_cast<double>(t.bytes) / static_cast<double>(total) : 0.0);
      out << (&t == &shares.front() ? "" : ",") << share;
    }
    out << "\n";
  }
  out << "KV bytes/token: ";
  for (DType t : kv_dtypes) {
    const int64_t b = kv_bytes(t);
    out << (t == DType::kF32 ? "" : ", ") << dtype_name(t) << " " << b;
  }
  if (c.mla()) {
    out << "  (" << c.n_layers << " layers x (kv_lora_rank " << c.kv_lora_rank << " + qk_rope_head_dim "
        << c.qk_rope_head_dim << ") x bytes per element: the latent cache)\n";
    out << "MHA equivalent: ";
    for (DType t : kv_dtypes)
      out << (t == DType::kF32 ? "" : ", ") << dtype_name(t) << " " << c.mha_kv_bytes_per_token(t);
    out << "  (" << c.n_layers << " layers x " << c.n_heads << " heads x (" << c.qk_nope_head_dim + c.qk_rope_head_dim
        << " key + " << c.v_head_dim << " value) x bytes; the latent cache is "
        << static_cast<double>(c.kv_bytes_per_token(DType::kF32)) / c.mha_kv_bytes_per_token(DType::kF32) << " of it)\n";
  } else {
    out << "  (2 x " << c.n_layers << " layers x " << c.n_kv_heads << " KV heads x " << c.head_dim
        << " head dim x bytes per element)\n";
  }
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
