// Internal to kvlab_model: what the three format loaders share. Each loader reads its file(s)
// into a TensorTable (name -> dtype, row-major shape, data pointer, file) and a ModelConfig, then
// build_weights() checks every shape against the config and fills the Model's views.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "framework/model/gguf.h"
#include "framework/model/model.h"

namespace kvlab::detail {

struct RawTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first: a matrix is {rows, cols}
  const void* data = nullptr;
  std::filesystem::path file;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[4096, 32000]"

class TensorTable {
 public:
  void add(const std::string& name, RawTensor t);  // throws on a duplicate name (naming both files)
  const RawTensor* find(std::string_view name) const;
  size_t size() const { return tensors_.size(); }

 private:
  std::map<std::string, RawTensor, std::less<>> tensors_;
};

// The tensor names of one file format. `layer(i, part)` with part one of: attn_norm wq wk wv wo
// bq bk bv ffn_norm w_gate w_up w_down q_norm k_norm post_attn_norm post_ffn_norm.
struct TensorNames {
  std::string tok_embeddings, final_norm, lm_head;
  std::string (*layer)(int layer, std::string_view part);
};
std::string gguf_tensor_name(int layer, std::string_view part);  // "blk.3.attn_q.weight", ...
std::string hf_tensor_name(int layer, std::string_view part);    // "model.layers.3.self_attn.q_proj.weight"
std::string hf_gemma_tensor_name(int layer, std::string_view part);  // Gemma 2/3's norm names
std::string hf_mla_tensor_name(int layer, std::string_view part);    // DeepSeek-V2/V3's MLA names

// Checks the config, then every tensor's shape, converts as LoadOptions asks, and fills
// model.tok_embeddings / layers / final_norm / lm_head / stored_dtype. model.config must be set;
// config.tied_embeddings decides whether names.lm_head is required.
void build_weights(Model& model, const TensorTable& table, const TensorNames& names,
                   const LoadOptions& opts);
void validate_config(const ModelConfig& c, const std::filesystem::path& file);

void load_gguf(Model& model, const std::filesystem::path& path, const LoadOptions& opts);
void load_hf(Model& model, const std::filesystem::path& dir, const LoadOptions& opts);
void load_llama2c(Model& model, const std::filesystem::path& path, const LoadOptions& opts);

}  // namespace kvlab::detail

namespace kvlab::detail {
// Sets model.tokenizer: opts.tokenizer_path if given; else the GGUF's tokenizer.ggml.* metadata
// (gguf non-null and has tokenizer.ggml.model); else the first existing candidate file.
// Records where it looked in model.tokenizer_search; throws when opts.require_tokenizer and none.
void attach_tokenizer(Model& model, const LoadOptions& opts,
                      const std::vector<std::filesystem::path>& candidates, const GgufFile* gguf);
}  // namespace kvlab::detail
