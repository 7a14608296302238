// Hugging Face directory -> Model.
//   config.json: architectures[0] in {LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
//     Qwen3ForCausalLM (q_norm / k_norm per head before RoPE, HF modeling_qwen3.py)};
//     hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//     num_key_value_heads (default: heads), head_dim (default hidden/heads), vocab_size,
//     max_position_embeddings, rope_theta (10000), rms_norm_eps (1e-6), tie_word_embeddings
//     (false), rope_scaling {rope_type|type: linear|llama3, factor, low_freq_factor,
//     high_freq_factor, original_max_position_embeddings}, attention_bias (llama: must be false;
//     qwen2 always has q/k/v biases; qwen3 must be false), sliding_window (Mistral, informative).
//   Gemma2ForCausalLM / Gemma3ForCausalLM: read_gemma() below; Gemma3ForConditionalGeneration
//     (vision tower) is refused by name.
//   DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (MLA, dense FFN layers): read_mla() below,
//     rope_scaling type yarn (factor, original_max_position_embeddings, beta_fast, beta_slow,
//     mscale, mscale_all_dim); interleaved RoPE (see rope_style below).
//   weights: model.safetensors, or shards named by model.safetensors.index.json's weight_map.
// HF stores Q/K for rotate-half RoPE: rope_style = kNeox (DeepSeek: kInterleaved).
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "framework/core/error.h"
#include "framework/core/json_file.h"
#include "framework/model/model_loader.h"
#include "framework/model/safetensors.h"

namespace kvlab::detail {

namespace {

using nlohmann::json;

// Typed access to config.json that names the file and key on failure.
struct ConfigReader {
  const json& j;
  std::string file;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  // A positive integer below 2^31. Integral floats (8192.0, as some exporters write) are
  // accepted; anything else, or out of range, names the key.
  int get_int(const char* key, const json* obj = nullptr) const {
    const json* v = obj ? find_in(*obj, key) : find(key);
    if (v == nullptr) fail(file, ": missing key '", key, "'");
    constexpr int64_t kMax = (int64_t{1} << 31) - 1;
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (!(d >= 1 && d <= double(kMax)) || d != std::floor(d))
        fail(file, ": key '", key, "' = ", v->dump(), ": expected a positive integer below 2^31");
      return static_cast<int>(d);
    }
    if (!v->is_number_integer()) fail(file, ": key '", key, "': expected an integer, got ", v->dump());
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(kMax))
      fail(file, ": key '", key, "' = ", v->dump(), " is out of range");
    const int64_t x = v->get<int64_t>();
    if (x <= 0 || x > kMax) fail(file, ": key '", key, "' = ", x, " is out of range");
    return static_cast<int>(x);
  }
  int get_int_or(const char* key, int fallback, const json* obj = nullptr) const {
    return (obj ? find_in(*obj, key) : find(key)) ? get_int(key, obj) : fallback;
  }
  static const json* find_in(const json& o, const char* key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
  }
  float get_float_or(const char* key, float fallback, const json* obj = nullptr) const {
    const json& src = obj ? *obj : j;
    auto it = src.find(key);
    if (it == src.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(file, ": key '", key, "': expected a number, got ", it->dump());
    const double d = it->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
      fail(file, ": key '", key, "' = ", it->dump(), ": expected a finite float32 number");
    return static_cast<float>(d);
  }
  bool get_bool_or(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(file, ": key '", key, "': expected true or false, got ", v->dump());
    return v->get<bool>();
  }
};

// The DeepSeek-V2 / V3 attention keys (HF configuration_deepseek.py): kv_lora_rank, q_lora_rank
// (null: one q_proj, V2-Lite), qk_nope_head_dim, qk_rope_head_dim, v_head_dim; the FFN is dense
// in layers [0, first_k_dense_replace) and mixture-of-experts after (n_routed_experts experts),
// which kvlab refuses. The cache and attention as the GGUF loader sets them (model_gguf.cpp):
// one latent KV head of kv_lora_rank + qk_rope_head_dim, scores scaled by
// 1/sqrt(qk_nope + qk_rope) times YaRN's mscale^2.
void read_mla(const ConfigReader& r, ModelConfig& c) {
  if (const json* e = r.find("n_routed_experts")) {
    const int dense = r.get_int_or("first_k_dense_replace", 0);
    if (dense < c.n_layers)
      fail(r.file, ": mixture-of-experts layers are not supported (n_routed_experts = ", e->dump(),
           ", first_k_dense_replace = ", dense, " of ", c.n_layers, " layers; MLA is supported with dense FFN layers only)");
  }
  c.kv_lora_rank = r.get_int("kv_lora_rank");
  c.q_lora_rank = r.find("q_lora_rank") ? r.get_int("q_lora_rank") : 0;  // null: no q_lora
  c.qk_nope_head_dim = r.get_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.get_int("qk_rope_head_dim");
  c.v_head_dim = r.get_int("v_head_dim");
  c.n_kv_heads = 1;
  c.head_dim = c.kv_lora_rank + c.qk_rope_head_dim;
  c.query_scale = 1.f / std::sqrt(static_cast<float>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  c.query_scale *= static_cast<float>(std::pow(yarn_attention_mscale(c), 2));  // 1 without yarn
}

// The Gemma 2 / 3 keys (HF configuration_gemma2.py / configuration_gemma3.py and their defaults):
// hidden_activation (or hidden_act) gelu_pytorch_tanh, query_pre_attn_scalar (256),
// sliding_window (4096), layer_types ["sliding_attention" | "full_attention", ...] or else
// sliding_window_pattern (Gemma 3: 6; layer i global iff (i + 1) % pattern == 0; Gemma 2: even
// layers local), attn_logit_softcapping / final_logit_softcapping (Gemma 2: 50 / 30; Gemma 3:
// null), rope_local_base_freq (Gemma 3: 10000).
void read_gemma(const ConfigReader& r, ModelConfig& c) {
  const std::string& cp = r.file;
  const bool g2 = c.arch == "gemma2";
  c.embed_scale = true;
  c.sandwich_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;
  // (HF reads hidden_activation; hidden_act is the older key)
  const char* act_key = r.find("hidden_activation") ? "hidden_activation" : "hidden_act";
  if (const json* act = r.find(act_key); act && *act != "gelu_pytorch_tanh")
    fail(cp, ": ", act_key, " ", act->dump(), " is not supported for ", c.arch, " (expected \"gelu_pytorch_tanh\")");
  if (r.get_bool_or("use_bidirectional_attention", false))
    fail(cp, ": use_bidirectional_attention = true (EmbeddingGemma) is not supported");
  const float qpas = r.get_float_or("query_pre_attn_scalar", 256.f);
  if (!(qpas > 0)) fail(cp, ": key 'query_pre_attn_scalar' must be positive");
  c.query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(qpas)));
  c.sliding_window = r.get_int_or("sliding_window", 4096);
  c.local_layers.assign(c.n_layers, 0);
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != c.n_layers)
      fail(cp, ": layer_types: expected an array of ", c.n_layers, " strings, got ", lt->dump());
    for (int i = 0; i < c.n_layers; ++i) {
      const json& t = (*lt)[i];
      if (t == "sliding_attention") c.local_layers[i] = 1;
      else if (t != "full_attention")
        fail(cp, ": layer_types[", i, "] = ", t.dump(), " (expected \"sliding_attention\" or \"full_attention\")");
    }
  } else {
    const int pattern = r.get_int_or("sliding_window_pattern", g2 ? 2 : 6);
    for (int i = 0; i < c.n_layers; ++i) c.local_layers[i] = (i + 1) % pattern != 0;
  }
  // An explicit null means no capping; an absent key the family's default.
  c.attn_softcap = r.j.contains("attn_logit_softcapping") ? r.get_float_or("attn_logit_softcapping", 0.f)
                                                          : (g2 ? 50.f : 0.f);
  c.final_softcap = r.j.contains("final_logit_softcapping") ? r.get_float_or("final_logit_softcapping", 0.f)
                                                            : (g2 ? 30.f : 0.f);
  if (!g2) c.rope_local_theta = r.get_float_or("rope_local_base_freq", 10000.f);
}

}  // namespace

void load_hf(Model& model, const std::filesystem::path& dir, const LoadOptions& opts) {
  const std::filesystem::path config_path = dir / "config.json";
  const json j = read_json_file(config_path);
  const std::string cp = config_path.string();
  if (!j.is_object()) fail(cp, ": expected a JSON object");
  ConfigReader r{j, cp};

  std::string architecture;
  if (const json* a = r.find("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    architecture = (*a)[0].get<std::string>();
  } else {
    fail(cp, ": missing key 'architectures' (expected e.g. [\"LlamaForCausalLM\"])");
  }
  ModelConfig& c = model.config;
  if (architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM") {
    c.arch = "llama";
  } else if (architecture == "Qwen2ForCausalLM") {
    c.arch = "qwen2";
  } else if (architecture == "Qwen3ForCausalLM") {
    c.arch = "qwen3";
    c.qk_norm = true;
  } else if (architecture == "Gemma2ForCausalLM") {
    c.arch = "gemma2";
  } else if (architecture == "Gemma3ForCausalLM") {
    c.arch = "gemma3";
    c.qk_norm = true;
  } else if (architecture == "DeepseekV2ForCausalLM" || architecture == "DeepseekV3ForCausalLM") {
    c.arch = "deepseek2";  // MLA attention (read_mla() below); dense FFN layers only
  } else if (architecture == "Gemma3ForConditionalGeneration") {
    fail(cp, ": Gemma3ForConditionalGeneration has a vision tower (SigLIP) and a multimodal projector, "
         "which kvlab does not run; convert its text_config part to a Gemma3ForCausalLM directory");
  } else {
    fail(cp, ": unsupported architecture '", architecture,
         "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
         "Gemma2ForCausalLM, Gemma3ForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  }
  const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
  const bool mla = c.arch == "deepseek2";
  // DeepSeek's modelling code reorders each RoPE part (2i, 2i+1) -> (i, i + d/2) before
  // rotate-half: the interleaved rotation of the stored weights, as llama.cpp's deepseek2.
  c.rope_style = mla ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  c.dim = r.get_int("hidden_size");
  c.hidden_dim = r.get_int("intermediate_size");
  c.n_layers = r.get_int("num_hidden_layers");
  c.n_heads = r.get_int("num_attention_heads");
  c.n_kv_heads = r.get_int_or("num_key_value_heads", c.n_heads);
  if (!mla && !r.find("head_dim") && c.dim % c.n_heads != 0) {
    fail(cp, ": hidden_size ", c.dim, " is not a multiple of num_attention_heads ", c.n_heads);
  }
  c.head_dim = r.get_int_or("head_dim", c.dim / c.n_heads);
  c.vocab_size = r.get_int("vocab_size");
  c.max_seq_len = r.get_int("max_position_embeddings");
  c.rope_theta = r.get_float_or("rope_theta", c.arch == "gemma3" ? 1e6f : 10000.f);
  c.rms_eps = r.get_float_or("rms_norm_eps", 1e-6f);
  c.tied_embeddings = r.get_bool_or("tie_word_embeddings", gemma);
  // Informative only (Mistral): an integer outside [1, 2^31) reads as "none".
  if (gemma) {
    read_gemma(r, c);
  } else if (const json* sw = r.find("sliding_window"); sw && sw->is_number_integer()) {
    const double w = sw->get<double>();
    if (w >= 1 && w < 2147483648.0) c.sliding_window = static_cast<int>(w);
  }
  if (c.arch == "qwen2") {
    c.qkv_bias = true;
  } else if (r.get_bool_or("attention_bias", false)) {
    fail(cp, ": attention_bias = true (bias on o_proj) is not supported for ", architecture);
  }
  if (r.get_bool_or("mlp_bias", false)) fail(cp, ": mlp_bias = true is not supported");
  if (const json* act = r.find("hidden_act"); !gemma && act && *act != "silu") {
    fail(cp, ": hidden_act ", act->dump(), " is not supported (expected \"silu\")");
  }
  // Gemma 3 under transformers 5: rope_parameters {full_attention: {rope_type, rope_theta,
  // factor}, sliding_attention: {rope_type: default, rope_theta}} instead of the legacy keys.
  const json* rs = r.find("rope_scaling");
  if (const json* rp = r.find("rope_parameters"); c.arch == "gemma3" && rp) {
    if (!rp->is_object()) fail(cp, ": rope_parameters: expected an object, got ", rp->dump());
    if (const json* full = ConfigReader::find_in(*rp, "full_attention")) {
      c.rope_theta = r.get_float_or("rope_theta", c.rope_theta, full);
      rs = full;
    }
    if (const json* local = ConfigReader::find_in(*rp, "sliding_attention")) {
      c.rope_local_theta = r.get_float_or("rope_theta", c.rope_local_theta, local);
      if (const json* t = ConfigReader::find_in(*local, "rope_type"); t && *t != "default")
        fail(cp, ": rope_parameters.sliding_attention.rope_type ", t->dump(), " is not supported (expected \"default\")");
    }
  }
  if (rs) {
    if (!rs->is_object()) fail(cp, ": rope_scaling: expected an object or null, got ", rs->dump());
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      if (rs->contains(k) && (*rs)[k].is_string()) {
        type = (*rs)[k].get<std::string>();
        break;
      }
    }
    if (type == "default") type = "none";
    if (type != "linear" && type != "llama3" && type != "none" && !(mla && type == "yarn")) {
      fail(cp, ": unsupported rope_scaling type '", type, "' (supported: linear, llama3, and yarn for DeepSeek)");
    }
    RopeScaling& s = c.rope_scaling;
    s.type = type;
    s.factor = r.get_float_or("factor", 1.f, rs);
    s.low_freq_factor = r.get_float_or("low_freq_factor", 1.f, rs);
    s.high_freq_factor = r.get_float_or("high_freq_factor", 4.f, rs);
    s.original_max_position = r.get_int_or("original_max_position_embeddings", 8192, rs);
    if (type == "yarn") {  // HF DeepseekV2YarnRotaryEmbedding's parameters and defaults
      s.beta_fast = r.get_float_or("beta_fast", 32.f, rs);
      s.beta_slow = r.get_float_or("beta_slow", 1.f, rs);
      s.mscale = r.get_float_or("mscale", 1.f, rs);
      s.mscale_all_dim = r.get_float_or("mscale_all_dim", 0.f, rs);
    }
  }
  if (mla) read_mla(r, c);

  // Weight files: one model.safetensors, or the shards of an index.
  std::vector<std::filesystem::path> files;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file (sharded only)
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(dir / "model.safetensors")) {
    files.push_back(dir / "model.safetensors");
  } else if (std::filesystem::exists(index_path)) {
    const json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail(index_path.string(), ": missing object 'weight_map'");
    }
    std::set<std::string> shard_names;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) fail(index_path.string(), ": weight_map['", tensor, "'] is not a file name");
      weight_map[tensor] = shard.get<std::string>();
      shard_names.insert(shard.get<std::string>());
    }
    for (const std::string& s : shard_names) {
      if (s.find('/') != std::string::npos) fail(index_path.string(), ": shard name '", s, "' contains '/'");
      files.push_back(dir / s);
    }
  } else {
    fail(dir.string(), ": no model.safetensors or model.safetensors.index.json");
  }

  TensorTable table;
  for (const std::filesystem::path& fp : files) {
    auto file = std::make_shared<SafetensorsFile>(SafetensorsFile::open(fp));
    for (const SafetensorsTensor& t : file->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it != weight_map.end() && it->second != fp.filename().string()) {
          fail(fp.string(), ": tensor '", t.name, "' is listed in ", index_path.string(), " under ",
               it->second);
        }
      }
      table.add(t.name, RawTensor{t.dtype, t.shape, t.data, fp});
    }
    model.storage.push_back(file);
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (table.find(tensor) == nullptr) {
      fail((dir / shard).string(), ": missing tensor '", tensor, "' listed in ", index_path.string());
    }
  }
  model.files = files;
  if (!c.tied_embeddings && table.find("lm_head.weight") == nullptr) {
    fail(dir.string(), ": missing tensor 'lm_head.weight' (config.json has tie_word_embeddings = false)");
  }
  build_weights(model, table, TensorNames{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                          gemma ? &hf_gemma_tensor_name
                                          : mla ? &hf_mla_tensor_name
                                                : &hf_tensor_name},
                opts);
  if (gemma) {  // Gemma's RMSNorm multiplies by (1 + w), in float32 (modeling_gemma3.py Gemma3RMSNorm)
    auto plus_one = [](std::vector<float>& w) { for (float& x : w) x = 1.f + x; };
    for (LayerWeights& l : model.layers)
      for (std::vector<float>* w : {&l.attn_norm, &l.ffn_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.q_norm, &l.k_norm})
        plus_one(*w);
    plus_one(model.final_norm);
  }
  attach_tokenizer(model, opts, {dir / "tokenizer.json", dir / "tokenizer.model"}, nullptr);
}

}  // namespace kvlab::detail
