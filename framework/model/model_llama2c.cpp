// llama2.c checkpoint -> Model (legacy "v0" export: run.c's format).
//
// Layout: 7 x int32 header {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}
// (vocab_size < 0: the classifier is stored separately, not shared with the embedding), then
// float32 arrays in this order (hd = dim / n_heads, L = n_layers):
//   token_embedding [vocab, dim], rms_att [L, dim], wq [L, n_heads*hd, dim], wk [L, n_kv*hd, dim],
//   wv [L, n_kv*hd, dim], wo [L, dim, n_heads*hd], rms_ffn [L, dim], w1 [L, hidden, dim],
//   w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim], freq_cis_real [seq_len, hd/2],
//   freq_cis_imag [seq_len, hd/2] (unused: RoPE is recomputed), wcls [vocab, dim] (unshared only).
// w1 is the gate, w3 the up projection, w2 the down projection. Q/K are in Meta's interleaved
// RoPE order. rope theta 10000, RMS epsilon 1e-5. The file size must match the header exactly.
//
// Version 1 export (export.py --version 1): u32 magic "ak42" (0x616b3432), i32 version = 1,
// the same 7 x int32 (vocab_size positive), u8 shared_classifier, zero padding to 256 bytes, then
// float32: rms_att [L, dim], rms_ffn [L, dim], rms_final [dim], token_embedding [vocab, dim],
// wq, wk, wv, wo, w1, w2, w3 (each [L, ...] as above), wcls [vocab, dim] when not shared.
// Version 2 (group-quantized int8) is refused with a clear message.
#include <cstring>

#include "framework/core/error.h"
#include "framework/model/mapped_file.h"
#include "framework/model/model_loader.h"

namespace kvlab::detail {

void load_llama2c(Model& model, const std::filesystem::path& path, const LoadOptions& opts) {
  auto map = std::make_shared<MappedFile>(MappedFile::open(path));
  model.storage.push_back(map);
  model.files = {path};
  const std::string p = path.string();
  constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
  if (map->size() < 7 * sizeof(int32_t)) {
    fail(p, ": truncated: ", map->size(), " bytes, too short for a llama2.c header (28 bytes); "
         "expected a .gguf file, a Hugging Face directory or a llama2.c checkpoint");
  }
  int32_t h[7];
  int version = 0;
  size_t header_bytes = 7 * sizeof(int32_t);
  bool shared = false;
  uint32_t magic = 0;
  std::memcpy(&magic, map->data(), 4);
  if (magic == kMagic) {
    std::memcpy(&version, map->data() + 4, 4);
    if (version != 1) {
      fail(p, ": llama2.c export version ", version, " is not supported (versions 0 and 1: float32)");
    }
    header_bytes = 256;
    if (map->size() < header_bytes) fail(p, ": truncated: ", map->size(), " bytes, the version 1 header has 256");
    std::memcpy(h, map->data() + 8, sizeof h);
    const auto flag = static_cast<uint8_t>(map->data()[8 + sizeof h]);
    if (flag > 1) fail(p, ": not a llama2.c checkpoint (shared_classifier byte is ", int(flag), ")");
    shared = flag == 1;
    if (h[5] < 0) fail(p, ": not a llama2.c checkpoint (version 1 with negative vocab_size ", h[5], ")");
  } else {
    std::memcpy(h, map->data(), sizeof h);
    shared = h[5] > 0;
  }
  const int64_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4],
                vocab = h[5] < 0 ? -int64_t{h[5]} : h[5], seq_len = h[6];
  auto header_error = [&](const std::string& why) {
    fail(p, ": not a llama2.c checkpoint (", why, "; header dim=", dim, " hidden_dim=", hidden,
         " n_layers=", n_layers, " n_heads=", n_heads, " n_kv_heads=", n_kv, " vocab_size=", h[5],
         " seq_len=", seq_len, ")");
  };
  constexpr int64_t kLimit = int64_t{1} << 24;
  for (int64_t v : {dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len}) {
    if (v <= 0 || v > kLimit) header_error("a header value is out of range");
  }
  if (dim % n_heads != 0) header_error("dim is not a multiple of n_heads");
  if (n_heads % n_kv != 0) header_error("n_heads is not a multiple of n_kv_heads");
  const int64_t hd = dim / n_heads;
  if (hd % 2 != 0) header_error("head dim is odd");

  // Expected float counts, in file order.
  const int64_t q_dim = n_heads * hd, kv_dim = n_kv * hd;
  struct Block { const char* name; int64_t rows, cols; int64_t count; };
  const std::vector<Block> blocks_v0 = {
      {"token_embedding", vocab, dim, 1},      {"rms_att", 1, dim, n_layers},
      {"wq", q_dim, dim, n_layers},            {"wk", kv_dim, dim, n_layers},
      {"wv", kv_dim, dim, n_layers},           {"wo", dim, q_dim, n_layers},
      {"rms_ffn", 1, dim, n_layers},           {"w1", hidden, dim, n_layers},
      {"w2", dim, hidden, n_layers},           {"w3", hidden, dim, n_layers},
      {"rms_final", 1, dim, 1},                {"freq_cis", seq_len, hd, 1},  // real + imag halves
      {"wcls", shared ? 0 : vocab, dim, 1}};
  const std::vector<Block> blocks_v1 = {
      {"rms_att", 1, dim, n_layers},           {"rms_ffn", 1, dim, n_layers},
      {"rms_final", 1, dim, 1},                {"token_embedding", vocab, dim, 1},
      {"wq", q_dim, dim, n_layers},            {"wk", kv_dim, dim, n_layers},
      {"wv", kv_dim, dim, n_layers},           {"wo", dim, q_dim, n_layers},
      {"w1", hidden, dim, n_layers},           {"w2", dim, hidden, n_layers},
      {"w3", hidden, dim, n_layers},           {"wcls", shared ? 0 : vocab, dim, 1}};
  const std::vector<Block>& blocks = version == 1 ? blocks_v1 : blocks_v0;
  // Each value is at most 2^24, so a block's rows * cols * count can reach 2^72: the sum is
  // accumulated with overflow checks and stops as soon as it passes what the file holds (nothing
  // is allocated or mapped from the header before this check).
  auto size_error = [&](bool short_file, const std::string& needs) {
    fail(p, ": ", short_file ? "truncated" : "size mismatch", ": llama2.c v", version, " header (dim=", dim,
         " hidden_dim=", hidden, " n_layers=", n_layers, " n_heads=", n_heads, " n_kv_heads=", n_kv,
         " vocab_size=", h[5], " seq_len=", seq_len, ") needs ", needs, " bytes, file has ", map->size());
  };
  const int64_t file_floats = static_cast<int64_t>((map->size() - header_bytes) / 4);
  int64_t expected_floats = 0;
  for (const Block& b : blocks) {
    int64_t floats = 0;
    if (__builtin_mul_overflow(b.rows, b.cols, &floats) || __builtin_mul_overflow(floats, b.count, &floats) ||
        __builtin_add_overflow(expected_floats, floats, &expected_floats) || expected_floats > file_floats) {
      size_error(true, str_cat("more than ", map->size(), " (at block ", b.name, ")"));
    }
  }
  const uint64_t expected_bytes = header_bytes + static_cast<uint64_t>(expected_floats) * 4;
  if (map->size() != expected_bytes) size_error(map->size() < expected_bytes, std::to_string(expected_bytes));

  ModelConfig& c = model.config;
  c.arch = "llama";
  c.rope_style = RopeStyle::kInterleaved;
  c.dim = static_cast<int>(dim);
  c.hidden_dim = static_cast<int>(hidden);
  c.n_layers = static_cast<int>(n_layers);
  c.n_heads = static_cast<int>(n_heads);
  c.n_kv_heads = static_cast<int>(n_kv);
  c.head_dim = static_cast<int>(hd);
  c.vocab_size = static_cast<int>(vocab);
  c.max_seq_len = static_cast<int>(seq_len);
  c.rope_theta = 10000.f;
  c.rms_eps = 1e-5f;
  c.tied_embeddings = shared;

  // Name the arrays with GGUF's tensor names so build_weights does the checks and conversions.
  static const std::map<std::string, std::string> kPart = {
      {"rms_att", "attn_norm"}, {"wq", "wq"}, {"wk", "wk"}, {"wv", "wv"}, {"wo", "wo"},
      {"rms_ffn", "ffn_norm"}, {"w1", "w_gate"}, {"w2", "w_down"}, {"w3", "w_up"}};
  TensorTable table;
  const std::byte* cursor = map->data() + header_bytes;
  for (const Block& b : blocks) {
    for (int64_t i = 0; i < b.count; ++i) {
      const std::vector<int64_t> shape =
          b.rows == 1 ? std::vector<int64_t>{b.cols} : std::vector<int64_t>{b.rows, b.cols};
      std::string name;
      if (std::strcmp(b.name, "token_embedding") == 0) name = "token_embd.weight";
      else if (std::strcmp(b.name, "rms_final") == 0) name = "output_norm.weight";
      else if (std::strcmp(b.name, "wcls") == 0) name = "output.weight";
      else if (std::strcmp(b.name, "freq_cis") == 0) name = "";
      else name = gguf_tensor_name(static_cast<int>(i), kPart.at(b.name));
      if (!name.empty() && b.rows > 0) table.add(name, RawTensor{DType::kF32, shape, cursor, path});
      cursor += b.rows * b.cols * 4;
    }
  }
  build_weights(model, table, TensorNames{"token_embd.weight", "output_norm.weight", "output.weight",
                                          &gguf_tensor_name},
                opts);
  attach_tokenizer(model, opts, {path.parent_path() / "tokenizer.bin"}, nullptr);
}

}  // namespace kvlab::detail
