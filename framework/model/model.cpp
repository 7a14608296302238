#include "framework/model/model.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <new>
#include <set>
#include <sstream>
#include <thread>

#include "framework/core/error.h"
#include "framework/model/model_loader.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {

void weight_row_to_float(const WeightView& w, int64_t r, float* out) {
  to_float(w.dtype, w.row(r), out, w.cols);
}

std::vector<float> weight_to_float(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) weight_row_to_float(w, r, out.data() + r * w.cols);
  return out;
}

Model::Model() = default;
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const Tokenizer& Model::require_tokenizer() const {
  if (!tokenizer) {
    fail(path.string(), ": no tokenizer found (looked for ", tokenizer_search,
         "); pass a tokenizer file explicitly");
  }
  return *tokenizer;
}

int64_t parameter_count(const Model& m) {
  int64_t n = m.tok_embeddings.rows * m.tok_embeddings.cols + static_cast<int64_t>(m.final_norm.size());
  if (!m.config.tied_embeddings) n += m.lm_head.rows * m.lm_head.cols;
  for (const LayerWeights& l : m.layers) {
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.wq_a, &l.wq_b,
                                &l.wkv_a, &l.wkv_b}) {
      n += w->rows * w->cols;
    }
    n += static_cast<int64_t>(l.attn_norm.size() + l.ffn_norm.size() + l.bq.size() + l.bk.size() +
                              l.bv.size() + l.q_norm.size() + l.k_norm.size() + l.post_attn_norm.size() +
                              l.post_ffn_norm.size() + l.q_a_norm.size() + l.kv_a_norm.size());
  }
  return n;
}

namespace detail {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

void TensorTable::add(const std::string& name, RawTensor t) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) {
    fail(t.file.string(), ": tensor '", name, "' appears twice (also in ", it->second.file.string(), ")");
  }
  tensors_.emplace(name, std::move(t));
}

const RawTensor* TensorTable::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string gguf_tensor_name(int layer, std::string_view part) {
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"attn_norm", "attn_norm.weight"}, {"wq", "attn_q.weight"},       {"wk", "attn_k.weight"},
      {"wv", "attn_v.weight"},           {"wo", "attn_output.weight"},  {"bq", "attn_q.bias"},
      {"bk", "attn_k.bias"},             {"bv", "attn_v.bias"},         {"ffn_norm", "ffn_norm.weight"},
      {"w_gate", "ffn_gate.weight"},     {"w_up", "ffn_up.weight"},     {"w_down", "ffn_down.weight"},
      {"q_norm", "attn_q_norm.weight"},  {"k_norm", "attn_k_norm.weight"},
      {"post_attn_norm", "post_attention_norm.weight"},
      {"post_ffn_norm", "post_ffw_norm.weight"},
      // deepseek2 (gguf-py constants.py ATTN_Q_A ... ATTN_KV_B)
      {"wq_a", "attn_q_a.weight"},       {"q_a_norm", "attn_q_a_norm.weight"}, {"wq_b", "attn_q_b.weight"},
      {"wkv_a", "attn_kv_a_mqa.weight"}, {"kv_a_norm", "attn_kv_a_norm.weight"},
      {"wkv_b", "attn_kv_b.weight"}};
  return str_cat("blk.", layer, ".", kParts.find(part)->second);
}

std::string hf_tensor_name(int layer, std::string_view part) {
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"attn_norm", "input_layernorm.weight"},
      {"wq", "self_attn.q_proj.weight"},
      {"wk", "self_attn.k_proj.weight"},
      {"wv", "self_attn.v_proj.weight"},
      {"wo", "self_attn.o_proj.weight"},
      {"bq", "self_attn.q_proj.bias"},
      {"bk", "self_attn.k_proj.bias"},
      {"bv", "self_attn.v_proj.bias"},
      {"ffn_norm", "post_attention_layernorm.weight"},
      {"w_gate", "mlp.gate_proj.weight"},
      {"w_up", "mlp.up_proj.weight"},
      {"w_down", "mlp.down_proj.weight"},
      {"q_norm", "self_attn.q_norm.weight"},
      {"k_norm", "self_attn.k_norm.weight"}};
  return str_cat("model.layers.", layer, ".", kParts.find(part)->second);
}

std::string hf_mla_tensor_name(int layer, std::string_view part) {
  // HF modeling_deepseek.py's DeepseekV2Attention (convert_hf_to_gguf.py maps them to attn_q_a ...)
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"wq_a", "self_attn.q_a_proj.weight"},           {"q_a_norm", "self_attn.q_a_layernorm.weight"},
      {"wq_b", "self_attn.q_b_proj.weight"},           {"wkv_a", "self_attn.kv_a_proj_with_mqa.weight"},
      {"kv_a_norm", "self_attn.kv_a_layernorm.weight"}, {"wkv_b", "self_attn.kv_b_proj.weight"}};
  if (auto it = kParts.find(part); it != kParts.end()) return str_cat("model.layers.", layer, ".", it->second);
  return hf_tensor_name(layer, part);
}

std::string hf_gemma_tensor_name(int layer, std::string_view part) {
  // HF modeling_gemma2.py / modeling_gemma3.py: post_attention_layernorm is the norm of the
  // attention OUTPUT; the pre-FFN norm is pre_feedforward_layernorm.
  if (part == "ffn_norm") return str_cat("model.layers.", layer, ".pre_feedforward_layernorm.weight");
  if (part == "post_attn_norm") return str_cat("model.layers.", layer, ".post_attention_layernorm.weight");
  if (part == "post_ffn_norm") return str_cat("model.layers.", layer, ".post_feedforward_layernorm.weight");
  return hf_tensor_name(layer, part);
}

namespace {

// Shared state of one build: the target dtype and a record of the stored dtypes.
struct Builder {
  Model& model;
  const TensorTable& table;
  const LoadOptions& opts;
  bool keep = true;
  DType target = DType::kF32;
  std::set<std::string> stored;

  const RawTensor& get(const std::string& name) const {
    const RawTensor* t = table.find(name);
    if (t == nullptr) {
      fail(model.path.string(), ": missing tensor '", name, "' (", model.config.arch, ", ",
           model.config.n_layers, " layers)");
    }
    return *t;
  }

  void check_shape(const std::string& name, const RawTensor& t, const std::vector<int64_t>& want) const {
    if (t.shape != want) {
      fail(t.file.string(), ": tensor '", name, "' has shape ", shape_string(t.shape), ", expected ",
           shape_string(want));
    }
  }

  // The tensor's data, or an aligned copy of it: a file may place a tensor at any byte offset
  // (a safetensors header of odd length, GGUF general.alignment = 1), and the kernels load
  // float / uint16 values directly.
  const void* aligned_data(const RawTensor& t, int64_t n_elements) {
    const size_t align = t.dtype == DType::kF32 ? alignof(float) : alignof(uint16_t);
    if (reinterpret_cast<uintptr_t>(t.data) % align == 0) return t.data;
    const size_t bytes = dtype_bytes(t.dtype, n_elements);
    auto copy = std::shared_ptr<std::byte[]>(new std::byte[bytes]);  // new[] aligns for any scalar
    std::memcpy(copy.get(), t.data, bytes);
    model.storage.push_back(std::shared_ptr<const void>(copy, copy.get()));
    return copy.get();
  }

  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const RawTensor& t = get(name);
    check_shape(name, t, {rows, cols});
    stored.insert(dtype_name(t.dtype));
    WeightView w{t.dtype, rows, cols, aligned_data(t, rows * cols)};
    if (keep || t.dtype == target) return w;
    if (target == DType::kQ8_0 && cols % kQ8_0BlockSize != 0) {
      fail(t.file.string(), ": tensor '", name, "' has ", cols,
           " columns, not a multiple of 32: cannot convert to q8_0");
    }
    if (is_block_quant(target) && !has_quantiser(target)) {
      fail(t.file.string(), ": tensor '", name, "': kvlab cannot convert to ", dtype_name(target),
           " (it quantises to q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k)");
    }
    if (is_block_quant(target) && cols % quant_block_values(target) != 0) {
      fail(t.file.string(), ": tensor '", name, "' has ", cols, " columns, not a multiple of ",
           quant_block_values(target), ": cannot convert to ", dtype_name(target));
    }
    auto buffer = std::shared_ptr<std::byte[]>(new std::byte[dtype_bytes(target, rows * cols)]);
    const size_t out_row_bytes = dtype_bytes(target, cols);
    // Rows are independent: convert them in parallel (a 7B model is ~7e9 values).
    auto convert = [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = begin; r < end; ++r) {
        weight_row_to_float(w, r, row.data());
        from_float(target, row.data(), buffer.get() + r * out_row_bytes, cols);
      }
    };
    const int64_t n_threads = std::clamp<int64_t>(rows * cols / (1 << 20), 1,
                                                  std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < n_threads; ++t) {
      threads.emplace_back(convert, rows * t / n_threads, rows * (t + 1) / n_threads);
    }
    convert(0, rows / n_threads);
    for (std::thread& th : threads) th.join();
    model.storage.push_back(std::shared_ptr<const void>(buffer, buffer.get()));
    return WeightView{target, rows, cols, buffer.get()};
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const RawTensor& t = get(name);
    check_shape(name, t, {n});
    std::vector<float> out(static_cast<size_t>(n));
    to_float(t.dtype, aligned_data(t, n), out.data(), n);
    return out;
  }
};

}  // namespace

void build_weights(Model& model, const TensorTable& table, const TensorNames& names,
                   const LoadOptions& opts) {
  const ModelConfig& c = model.config;
  validate_config(c, model.path);
  Builder b{model, table, opts, true, DType::kF32, {}};
  if (opts.weight_dtype != "keep") {
    b.keep = false;
    b.target = parse_dtype(opts.weight_dtype);
  }
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  // First every tensor the config names is looked up and its shape checked, allocating nothing:
  // a corrupt count (block_count = 67,108,865 from one flipped bit) fails at its first missing
  // tensor instead of sizing per-layer tables (and converted copies) from the header.
  auto expect = [&](const std::string& name, const std::vector<int64_t>& shape) {
    b.check_shape(name, b.get(name), shape);
  };
  expect(names.tok_embeddings, {c.vocab_size, c.dim});
  // MLA: the query [n_heads, nope + rope], W_kvb's [n_heads, nope + v] rows, Wo over n_heads * v
  const int64_t mla_q = int64_t{c.n_heads} * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  const int64_t mla_kvb = int64_t{c.n_heads} * (c.qk_nope_head_dim + c.v_head_dim);
  const int64_t mla_o = int64_t{c.n_heads} * c.v_head_dim;
  for (int i = 0; i < c.n_layers; ++i) {
    auto name = [&](const char* part) { return names.layer(i, part); };
    expect(name("attn_norm"), {c.dim});
    if (c.mla()) {
      if (c.q_lora_rank > 0) {
        expect(name("wq_a"), {c.q_lora_rank, c.dim});
        expect(name("q_a_norm"), {c.q_lora_rank});
        expect(name("wq_b"), {mla_q, c.q_lora_rank});
      } else {
        expect(name("wq"), {mla_q, c.dim});
      }
      expect(name("wkv_a"), {c.kv_lora_rank + c.qk_rope_head_dim, c.dim});
      expect(name("kv_a_norm"), {c.kv_lora_rank});
      expect(name("wkv_b"), {mla_kvb, c.kv_lora_rank});
      expect(name("wo"), {c.dim, mla_o});
    } else {
      expect(name("wq"), {q_dim, c.dim});
      expect(name("wk"), {kv_dim, c.dim});
      expect(name("wv"), {kv_dim, c.dim});
      expect(name("wo"), {c.dim, q_dim});
    }
    if (c.qkv_bias) {
      expect(name("bq"), {q_dim});
      expect(name("bk"), {kv_dim});
      expect(name("bv"), {kv_dim});
    }
    if (c.qk_norm) {
      expect(name("q_norm"), {c.head_dim});
      expect(name("k_norm"), {c.head_dim});
    }
    expect(name("ffn_norm"), {c.dim});
    if (c.sandwich_norms) {
      expect(name("post_attn_norm"), {c.dim});
      expect(name("post_ffn_norm"), {c.dim});
    }
    expect(name("w_gate"), {c.hidden_dim, c.dim});
    expect(name("w_up"), {c.hidden_dim, c.dim});
    expect(name("w_down"), {c.dim, c.hidden_dim});
  }
  expect(names.final_norm, {c.dim});
  if (!c.tied_embeddings) expect(names.lm_head, {c.vocab_size, c.dim});

  model.tok_embeddings = b.matrix(names.tok_embeddings, c.vocab_size, c.dim);
  model.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = model.layers[i];
    auto name = [&](const char* part) { return names.layer(i, part); };
    l.attn_norm = b.vector(name("attn_norm"), c.dim);
    if (c.mla()) {
      if (c.q_lora_rank > 0) {
        l.wq_a = b.matrix(name("wq_a"), c.q_lora_rank, c.dim);
        l.q_a_norm = b.vector(name("q_a_norm"), c.q_lora_rank);
        l.wq_b = b.matrix(name("wq_b"), mla_q, c.q_lora_rank);
      } else {
        l.wq = b.matrix(name("wq"), mla_q, c.dim);
      }
      l.wkv_a = b.matrix(name("wkv_a"), c.kv_lora_rank + c.qk_rope_head_dim, c.dim);
      l.kv_a_norm = b.vector(name("kv_a_norm"), c.kv_lora_rank);
      l.wkv_b = b.matrix(name("wkv_b"), mla_kvb, c.kv_lora_rank);
      l.wo = b.matrix(name("wo"), c.dim, mla_o);
    } else {
      l.wq = b.matrix(name("wq"), q_dim, c.dim);
      l.wk = b.matrix(name("wk"), kv_dim, c.dim);
      l.wv = b.matrix(name("wv"), kv_dim, c.dim);
      l.wo = b.matrix(name("wo"), c.dim, q_dim);
    }
    if (c.qkv_bias) {
      l.bq = b.vector(name("bq"), q_dim);
      l.bk = b.vector(name("bk"), kv_dim);
      l.bv = b.vector(name("bv"), kv_dim);
    }
    if (c.qk_norm) {
      l.q_norm = b.vector(name("q_norm"), c.head_dim);
      l.k_norm = b.vector(name("k_norm"), c.head_dim);
    }
    l.ffn_norm = b.vector(name("ffn_norm"), c.dim);
    if (c.sandwich_norms) {
      l.post_attn_norm = b.vector(name("post_attn_norm"), c.dim);
      l.post_ffn_norm = b.vector(name("post_ffn_norm"), c.dim);
    }
    l.w_gate = b.matrix(name("w_gate"), c.hidden_dim, c.dim);
    l.w_up = b.matrix(name("w_up"), c.hidden_dim, c.dim);
    l.w_down = b.matrix(name("w_down"), c.dim, c.hidden_dim);
  }
  model.final_norm = b.vector(names.final_norm, c.dim);
  model.lm_head = c.tied_embeddings ? model.tok_embeddings : b.matrix(names.lm_head, c.vocab_size, c.dim);
  std::string stored;
  for (const std::string& s : b.stored) stored += (stored.empty() ? "" : ", ") + s;
  model.stored_dtype = b.stored.size() == 1 ? stored : "mixed (" + stored + ")";
}

void attach_tokenizer(Model& model, const LoadOptions& opts,
                      const std::vector<std::filesystem::path>& candidates, const GgufFile* gguf) {
  if (!opts.load_tokenizer && !opts.require_tokenizer) return;
  std::string searched;
  if (!opts.tokenizer_path.empty()) {
    model.tokenizer_search = opts.tokenizer_path.string();
    model.tokenizer = load_tokenizer(opts.tokenizer_path);
    return;
  }
  if (gguf != nullptr) {
    searched = "tokenizer.ggml.* metadata in " + gguf->path().string();
    if (gguf->find("tokenizer.ggml.model") != nullptr) {
      model.tokenizer_search = searched;
      model.tokenizer = tokenizer_from_gguf(*gguf);
      return;
    }
  }
  for (const std::filesystem::path& p : candidates) {
    searched += (searched.empty() ? "" : ", ") + p.string();
    if (std::filesystem::exists(p)) {
      model.tokenizer_search = p.string();
      model.tokenizer = load_tokenizer(p);
      return;
    }
  }
  model.tokenizer_search = searched;
  if (opts.require_tokenizer) model.require_tokenizer();
}

}  // namespace detail

namespace {

bool has_gguf_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

namespace {

std::unique_ptr<Model> load_model_unguarded(const std::filesystem::path& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  auto model = std::make_unique<Model>();
  model->path = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), ": no such file or directory");
  if (fs::is_directory(path)) {
    if (!fs::exists(path / "config.json")) {
      fail(path.string(), ": directory has no config.json (expected a Hugging Face model "
           "directory; pass a .gguf or llama2.c .bin file directly)");
    }
    model->format = "hf";
    detail::load_hf(*model, path, opts);
    return model;
  }
  const std::string ext = path.extension().string();
  if (path.filename() == "config.json" || ext == ".safetensors" ||
      path.filename() == "model.safetensors.index.json") {
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    model->path = dir;
    model->format = "hf";
    detail::load_hf(*model, dir, opts);
    return model;
  }
  if (ext == ".gguf" || has_gguf_magic(path)) {
    model->format = "gguf";
    detail::load_gguf(*model, path, opts);
    return model;
  }
  model->format = "llama2c";
  detail::load_llama2c(*model, path, opts);
  return model;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::filesystem::path& path, const LoadOptions& opts) {
  // Sizes are checked against the files before allocating, so running out of memory here means
  // a model too large for this machine (or a bound still missing): one error naming the file.
  try {
    return load_model_unguarded(path, opts);
  } catch (const std::bad_alloc&) {
    fail(path.string(), ": out of memory while loading the model (weight dtype ", opts.weight_dtype, ")");
  } catch (const std::filesystem::filesystem_error& e) {
    fail(path.string(), ": ", e.code().message(), " (", e.path1().string(), ")");
  }
}

}  // namespace kvlab
