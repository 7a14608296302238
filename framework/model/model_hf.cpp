// Hugging Face directory -> Model.
//   config.json: architectures[0] in {LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
//     Qwen3ForCausalLM (q_norm / k_norm per head before RoPE, HF modeling_qwen3.py)};
//     hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//     num_key_value_heads (default: heads), head_dim (default hidden/heads), vocab_size,
//     max_position_embeddings, rope_theta (10000), rms_norm_eps (1e-6), tie_word_embeddings
//     (false), rope_scaling {rope_type|type: linear|llama3, factor, low_freq_factor,
//     high_freq_factor, original_max_position_embeddings}, attention_bias (llama: must be false;
//     qwen2 always has q/k/v biases; qwen3 must be false), sliding_window (Mistral, informative).
//   weights: model.safetensors, or shards named by model.safetensors.index.json's weight_map.
// HF stores Q/K for rotate-half RoPE: rope_style = kNeox.
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "framework/core/error.h"
#include "framework/model/model_loader.h"
#include "framework/model/safetensors.h"

namespace kvlab::detail {

namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(path.string(), ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path.string(), ": invalid JSON: ", e.what());
  }
}

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

}  // namespace

void load_hf(Model& model, const std::filesystem::path& dir, const LoadOptions& opts) {
  const std::filesystem::path config_path = dir / "config.json";
  const json j = read_json(config_path);
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
  } else {
    fail(cp, ": unsupported architecture '", architecture,
         "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }
  c.rope_style = RopeStyle::kNeox;
  c.dim = r.get_int("hidden_size");
  c.hidden_dim = r.get_int("intermediate_size");
  c.n_layers = r.get_int("num_hidden_layers");
  c.n_heads = r.get_int("num_attention_heads");
  c.n_kv_heads = r.get_int_or("num_key_value_heads", c.n_heads);
  if (!r.find("head_dim") && c.dim % c.n_heads != 0) {
    fail(cp, ": hidden_size ", c.dim, " is not a multiple of num_attention_heads ", c.n_heads);
  }
  c.head_dim = r.get_int_or("head_dim", c.dim / c.n_heads);
  c.vocab_size = r.get_int("vocab_size");
  c.max_seq_len = r.get_int("max_position_embeddings");
  c.rope_theta = r.get_float_or("rope_theta", 10000.f);
  c.rms_eps = r.get_float_or("rms_norm_eps", 1e-6f);
  c.tied_embeddings = r.get_bool_or("tie_word_embeddings", false);
  // Informative only: an integer outside [1, 2^31) reads as "none".
  if (const json* sw = r.find("sliding_window"); sw && sw->is_number_integer()) {
    const double w = sw->get<double>();
    if (w >= 1 && w < 2147483648.0) c.sliding_window = static_cast<int>(w);
  }
  if (c.arch == "qwen2") {
    c.qkv_bias = true;
  } else if (r.get_bool_or("attention_bias", false)) {
    fail(cp, ": attention_bias = true (bias on o_proj) is not supported for ", architecture);
  }
  if (r.get_bool_or("mlp_bias", false)) fail(cp, ": mlp_bias = true is not supported");
  if (const json* act = r.find("hidden_act"); act && *act != "silu") {
    fail(cp, ": hidden_act ", act->dump(), " is not supported (expected \"silu\")");
  }
  if (const json* rs = r.find("rope_scaling")) {
    if (!rs->is_object()) fail(cp, ": rope_scaling: expected an object or null, got ", rs->dump());
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      if (rs->contains(k) && (*rs)[k].is_string()) {
        type = (*rs)[k].get<std::string>();
        break;
      }
    }
    if (type == "default") type = "none";
    if (type != "linear" && type != "llama3" && type != "none") {
      fail(cp, ": unsupported rope_scaling type '", type, "' (supported: linear, llama3)");
    }
    RopeScaling& s = c.rope_scaling;
    s.type = type;
    s.factor = r.get_float_or("factor", 1.f, rs);
    s.low_freq_factor = r.get_float_or("low_freq_factor", 1.f, rs);
    s.high_freq_factor = r.get_float_or("high_freq_factor", 4.f, rs);
    s.original_max_position = r.get_int_or("original_max_position_embeddings", 8192, rs);
  }

  // Weight files: one model.safetensors, or the shards of an index.
  std::vector<std::filesystem::path> files;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file (sharded only)
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(dir / "model.safetensors")) {
    files.push_back(dir / "model.safetensors");
  } else if (std::filesystem::exists(index_path)) {
    const json index = read_json(index_path);
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
                                          &hf_tensor_name},
                opts);
  attach_tokenizer(model, opts, {dir / "tokenizer.json", dir / "tokenizer.model"}, nullptr);
}

}  // namespace kvlab::detail
