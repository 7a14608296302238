// Bad model files fail with one clear error naming the file and what is wrong; sizes, counts and
// numbers read from a file are checked before anything is allocated (issue 11's resource limits).
// The fixtures: model_test.cpp.
#include "framework/model/model.h"
#include "framework/model/safetensors.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/model/model_test_util.h"

namespace kvlab {
namespace {

using namespace model_testing;

TEST(BadInput, MissingFile) {
  expect_error(fixtures_dir() / "nope.gguf", {"nope.gguf", "no such file"});
  expect_error(fixtures_dir() / "bad", {"no config.json"});
}

TEST(BadInput, TruncatedFilesInEveryFormat) {
  const fs::path src = fixtures_dir() / kSmall;
  struct Case { fs::path from; std::string name; };
  for (const Case& c : {Case{src / "model.gguf", "t.gguf"}, Case{src / "model.bin", "t.bin"}}) {
    const std::string bytes = read_bytes(c.from);
    for (size_t n : {size_t{0}, size_t{3}, size_t{20}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
      const fs::path p = scratch(c.name);
      write_bytes(p, bytes.substr(0, n));
      expect_error(p, {p.string(), "truncated"});
    }
  }
  const fs::path hf = scratch("hf_trunc");
  fs::create_directories(hf);
  fs::copy_file(src / "hf/config.json", hf / "config.json", fs::copy_options::overwrite_existing);
  const std::string st = read_bytes(src / "hf/model.safetensors");
  for (size_t n : {size_t{4}, size_t{100}, st.size() - 1}) {
    write_bytes(hf / "model.safetensors", st.substr(0, n));
    expect_error(hf, {"model.safetensors", "truncated"});
  }
}

TEST(BadInput, WrongMagic) {
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.gguf");
  bytes.replace(0, 4, "GGUX");
  const fs::path p = scratch("magic.gguf");
  write_bytes(p, bytes);
  expect_error(p, {p.string(), "wrong magic"});
  // Not a GGUF by name or magic: read as llama2.c, whose header then does not fit.
  const fs::path txt = scratch("notes.bin");
  write_bytes(txt, std::string(4096, 'x'));
  expect_error(txt, {txt.string(), "not a llama2.c checkpoint"});
}

TEST(BadInput, UnsupportedTensorTypeArchitectureAndShape) {
  const fs::path bad = fixtures_dir() / "bad";
  expect_error(bad / "iq4_nl_tensor.gguf",
               {"iq4_nl_tensor.gguf", "token_embd.weight", "unsupported tensor type IQ4_NL (20)",
                "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"});
  expect_error(bad / "unknown_arch.gguf", {"unknown_arch.gguf", "unsupported architecture 'gpt2'"});
  expect_error(bad / "shape_mismatch.gguf",
               {"shape_mismatch.gguf", "blk.1.attn_k.weight", "shape [96, 64]", "expected [64, 64]"});
}

// An HF directory whose config.json is edited by `edit` (weights linked from the fixture).
fs::path hf_with_config(const std::string& name, void (*edit)(json&), const std::string& fixture = kSmall) {
  const fs::path src = fixtures_dir() / fixture / "hf";
  const fs::path dir = scratch(name);
  fs::create_directories(dir);
  json config = read_json(src / "config.json");
  edit(config);
  std::ofstream(dir / "config.json") << config.dump();
  fs::remove(dir / "model.safetensors");
  fs::create_symlink(src / "model.safetensors", dir / "model.safetensors");
  return dir;
}

TEST(BadInput, GemmaConfigProblems) {
  const std::string g3 = "gemma3_hd64_gqa2_w5";
  expect_error(hf_with_config("g3_vision", [](json& c) { c["architectures"] = {"Gemma3ForConditionalGeneration"}; }, g3),
               {"config.json", "Gemma3ForConditionalGeneration", "vision tower"});
  expect_error(hf_with_config("g3_types", [](json& c) { c["layer_types"] = {"sliding_attention"}; }, g3),
               {"config.json", "layer_types", "array of 6 strings"});
  expect_error(hf_with_config("g3_kind", [](json& c) {
                 c["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                                     "sliding_attention", "sliding_attention", "chunked_attention"};
               }, g3),
               {"config.json", "layer_types[5]", "chunked_attention"});
  expect_error(hf_with_config("g3_act", [](json& c) { c["hidden_activation"] = "relu"; }, g3),
               {"config.json", "hidden_activation", "relu"});
  expect_error(hf_with_config("g3_rope", [](json& c) {
                 c["rope_parameters"] = {{"sliding_attention", {{"rope_type", "yarn"}, {"rope_theta", 1e4}}}};
               }, g3),
               {"config.json", "sliding_attention.rope_type", "yarn"});
  expect_error(hf_with_config("g3_window", [](json& c) { c["sliding_window"] = 0; }, g3),
               {"config.json", "'sliding_window'", "out of range"});
  expect_error(hf_with_config("g3_cap", [](json& c) { c["attn_logit_softcapping"] = -1.0; }, g3),
               {"attn_logit_softcapping", "must be finite and >= 0"});
  expect_error(hf_with_config("g3_bidir", [](json& c) { c["use_bidirectional_attention"] = true; }, g3),
               {"config.json", "use_bidirectional_attention"});
}

TEST(BadInput, HfConfigProblems) {
  expect_error(hf_with_config("hf_arch", [](json& c) { c["architectures"] = {"GPT2LMHeadModel"}; }),
               {"config.json", "unsupported architecture 'GPT2LMHeadModel'"});
  expect_error(hf_with_config("hf_shape", [](json& c) { c["intermediate_size"] = 128; }),
               {"model.safetensors", "model.layers.0.mlp.gate_proj.weight", "shape [160, 64]",
                "expected [128, 64]"});
  expect_error(hf_with_config("hf_untied", [](json& c) { c["tie_word_embeddings"] = false; }),
               {"missing tensor 'lm_head.weight'"});
  expect_error(hf_with_config("hf_missing", [](json& c) { c.erase("hidden_size"); }),
               {"config.json", "missing key 'hidden_size'"});
  expect_error(hf_with_config("hf_type", [](json& c) { c["num_hidden_layers"] = "two"; }),
               {"config.json", "'num_hidden_layers'", "expected an integer"});
  expect_error(hf_with_config("hf_layers", [](json& c) { c["num_hidden_layers"] = 3; }),
               {"missing tensor 'model.layers.2.input_layernorm.weight'"});
  expect_error(hf_with_config("hf_rope", [](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}}; }),
               {"unsupported rope_scaling type 'yarn'"});
}

TEST(BadInput, MissingTokenizer) {
  const fs::path dir = scratch("l2c_no_tok");
  fs::create_directories(dir);
  fs::remove(dir / "model.bin");
  fs::create_symlink(fixtures_dir() / kSmall / "model.bin", dir / "model.bin");
  LoadOptions opts;
  opts.require_tokenizer = true;
  expect_error(dir / "model.bin", {"model.bin", "no tokenizer found", "tokenizer.bin"}, opts);
  LoadOptions lenient;
  const auto m = load_model(dir / "model.bin", lenient);
  EXPECT_EQ(m->tokenizer, nullptr);
  try {
    m->require_tokenizer();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.bin"), std::string::npos) << e.what();
  }
}

TEST(BadInput, Llama2cSizeMismatchAndBadHeader) {
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.bin");
  const fs::path p = scratch("extra.bin");
  write_bytes(p, bytes + std::string(4, '\0'));
  expect_error(p, {"size mismatch", "dim=64"});
  int32_t heads = 3;  // dim 64 is not a multiple of 3
  std::memcpy(&bytes[12], &heads, 4);
  write_bytes(p, bytes);
  expect_error(p, {"not a llama2.c checkpoint", "dim is not a multiple of n_heads"});

  std::string v1 = read_bytes(fixtures_dir() / kSmall / "model-v1.bin");
  write_bytes(p, v1.substr(0, 100));
  expect_error(p, {"truncated", "256"});
  int32_t version = 2;
  std::memcpy(&v1[4], &version, 4);
  write_bytes(p, v1);
  expect_error(p, {"llama2.c export version 2 is not supported"});
}

// Random byte corruption of headers and metadata: either a clean load or a kvlab::Error, never a
// crash or another exception type (std::bad_alloc, std::length_error, ...).
TEST(BadInput, RandomCorruptionGivesErrorsNotCrashes) {
  std::mt19937 rng(1234);
  const fs::path small = fixtures_dir() / kSmall;
  struct Target { fs::path src; std::string name; size_t region; };
  const fs::path hf_dir = scratch("hf_corrupt");
  fs::create_directories(hf_dir);
  fs::copy_file(small / "hf/config.json", hf_dir / "config.json", fs::copy_options::overwrite_existing);
  for (const Target& t : {Target{small / "model.gguf", "c.gguf", 12000}, Target{small / "model.bin", "c.bin", 28},
                          Target{small / "model-v1.bin", "c1.bin", 256},
                          Target{small / "hf/model.safetensors", "hf_corrupt/model.safetensors", 2500}}) {
    const std::string clean = read_bytes(t.src);
    int errors = 0;
    for (int iter = 0; iter < 80; ++iter) {
      std::string bytes = clean;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) {
        bytes[rng() % std::min(t.region, bytes.size())] = static_cast<char>(rng());
      }
      const fs::path p = scratch(t.name);
      write_bytes(p, bytes);
      LoadOptions opts;
      opts.load_tokenizer = false;
      try {
        load_model(t.name.rfind("hf_", 0) == 0 ? hf_dir : p, opts);
      } catch (const Error&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << t.name << " iteration " << iter << ": non-kvlab exception: " << e.what();
      }
    }
    EXPECT_GT(errors, 0) << t.name;
  }
}

TEST(BadInput, QuantizingOddColumnsIsRefused) {
  // dim 64: no multiple of q4_k's 256-value blocks; an unknown dtype fails clearly too.
  LoadOptions opts;
  opts.load_tokenizer = false;
  for (auto [dtype, want] : {std::pair{"q4_k", "columns, not a multiple of 256: cannot convert to q4_k"},
                             std::pair{"iq4_nl", "unknown dtype 'iq4_nl'"}}) {
    opts.weight_dtype = dtype;
    try {
      load_model(fixtures_dir() / kSmall / "model.gguf", opts);
      ADD_FAILURE() << dtype;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// --weight-dtype to kvlab's own quantisers: every block type with a quantiser loads and runs
// (the weights equal from_float of the f32 weights); q2_k / q3_k (no quantiser) are refused.
TEST(Model, ConvertsToBlockQuantTypes) {
  LoadOptions opts;
  opts.load_tokenizer = false;
  for (const char* dtype : {"q4_0", "q4_1", "q5_0", "q5_1"}) {
    opts.weight_dtype = dtype;
    const auto m = load_model(fixtures_dir() / kSmall / "model.gguf", opts);
    EXPECT_EQ(m->layers[0].wq.dtype, parse_dtype(dtype));
    EXPECT_EQ(m->tok_embeddings.dtype, parse_dtype(dtype));
  }
  opts.weight_dtype = "q2_k";
  try {
    load_model(fixtures_dir() / "llama_hd64_gqa2_untied" / "model.gguf", opts);
    ADD_FAILURE() << "q2_k";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'token_embd.weight': kvlab cannot convert to q2_k"),
              std::string::npos) << e.what();
  }
}

// ----- resource limits (issue 11): sizes read from a file are checked before anything is
// allocated. Each case replays a fuzzer finding.

// Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

TEST(ResourceLimits, Llama2cHeaderProductsThatOverflowInt64AreTruncated) {
  // 36-byte files whose header values are each within 2^24 but whose block sizes multiply past
  // int64 (hidden * dim * n_layers = 2^72): they passed the size check through wrapped sums and
  // then segfaulted, hung building tensor tables, or reported a wrapped byte count.
  struct Header { int32_t dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len; };
  const int32_t big = 1 << 24;
  for (const Header& h : {Header{big, big, big, 1 << 20, 1 << 20, big, big},
                          Header{big, big, big, 1 << 22, 1 << 22, -big, big},
                          Header{1 << 16, big, big, 1 << 10, 1 << 10, 1 << 10, 1},
                          Header{2, big, big, 1, 1, 1, 1}}) {
    std::string bytes(sizeof h, '\0');
    std::memcpy(bytes.data(), &h, sizeof h);
    bytes += std::string(8, '\0');
    const fs::path p = scratch("overflow.bin");
    write_bytes(p, bytes);
    expect_error(p, {p.string(), "truncated", "needs more than 36"});
  }
  // The same in a version 1 header.
  std::string v1(256, '\0');
  const uint32_t magic = 0x616b3432;
  const int32_t version = 1;
  const int32_t header[7] = {big, big, big, 1 << 20, 1 << 20, big, big};
  std::memcpy(v1.data(), &magic, 4);
  std::memcpy(v1.data() + 4, &version, 4);
  std::memcpy(v1.data() + 8, header, sizeof header);
  const fs::path p = scratch("overflow_v1.bin");
  write_bytes(p, v1);
  expect_error(p, {p.string(), "truncated", "needs more than 256"});
}

TEST(ResourceLimits, GgufBlockCountBitFlipFailsAtTheFirstMissingTensor) {
  // One flipped bit: llama.block_count 2 -> 67,108,866 (0x04000002). Before, build_weights sized
  // 67M layer tables (~21.5 GiB) before looking at a tensor.
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.gguf");
  const std::string key = "llama.block_count";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4;  // after the key: u32 type (UINT32), then the value
  uint32_t layers = 0;
  std::memcpy(&layers, &bytes[value], 4);
  ASSERT_EQ(layers, 2u);
  layers |= 1u << 26;
  std::memcpy(&bytes[value], &layers, 4);
  const fs::path p = scratch("block_count.gguf");
  write_bytes(p, bytes);
  const double rss_before = peak_rss_mib();
  expect_error(p, {p.string(), "missing tensor 'blk.2.attn_norm.weight'", "67108866 layers"});
  // The fixture is 0.4 MiB; 64 MiB of headroom covers the allocator, not a per-layer table.
  EXPECT_LT(peak_rss_mib() - rss_before, 64.0);
}

TEST(ResourceLimits, HfConfigNumbersOutOfRangeNameTheKey) {
  // original_max_position_embeddings: 1e12 was an undefined float -> int conversion (exit 0).
  expect_error(hf_with_config("hf_rope_pos", [](json& c) {
                 c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 1e12}};
               }),
               {"config.json", "'original_max_position_embeddings' = 1000000000000.0",
                "expected a positive integer below 2^31"});
  // An integral float is an integer (some exporters write 8192.0).
  {
    const fs::path dir = hf_with_config("hf_rope_pos_ok", [](json& c) {
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
    });
    EXPECT_EQ(load(dir)->config.rope_scaling.original_max_position, 8192);
  }
  expect_error(hf_with_config("hf_theta", [](json& c) { c["rope_theta"] = 1e39; }),
               {"config.json", "'rope_theta'", "expected a finite float32 number"});
  expect_error(hf_with_config("hf_layers_u64", [](json& c) { c["num_hidden_layers"] = uint64_t{1} << 63; }),
               {"config.json", "'num_hidden_layers'", "out of range"});
}

TEST(ResourceLimits, SafetensorsHeaderNumberOutOfRangeIsAnError) {
  // 1e400 made nlohmann throw out_of_range, which escaped (only parse_error was caught).
  const fs::path dir = scratch("hf_1e400");
  fs::create_directories(dir);
  fs::copy_file(fixtures_dir() / kSmall / "hf/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const std::string header = R"({"model.norm.weight": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  write_bytes(dir / "model.safetensors", file + header + std::string(4, '\0'));
  expect_error(dir, {"model.safetensors", "header is not valid JSON"});
  // A shape whose dimensions multiply past int64 before the 2^50 check.
  const std::string wide = R"({"t": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 1099511627776], "data_offsets": [0, 4]}})";
  const uint64_t m = wide.size();
  std::memcpy(file.data(), &m, 8);
  write_bytes(dir / "model.safetensors", file + wide + std::string(4, '\0'));
  expect_error(dir, {"model.safetensors", "tensor 't': bad shape"});
}

TEST(ResourceLimits, OverlongPathComponentIsAnErrorNamingThePath) {
  const fs::path p = fixtures_dir() / (std::string(300, 'x') + ".bin");
  expect_error(p, {std::string(300, 'x')});
  const fs::path dir = fixtures_dir() / std::string(300, 'y') / "model.gguf";
  expect_error(dir, {std::string(300, 'y')});
}

TEST(ResourceLimits, MisalignedTensorDataIsCopiedNotReadInPlace) {
  // fuzz_hf: a header of odd length put every tensor at an odd address, and the F32/BF16 reads
  // were misaligned (UBSan). Such a file is valid; the loader copies those tensors.
  const fs::path src = fixtures_dir() / kSmall / "hf";
  const fs::path dir = scratch("hf_misaligned");
  fs::create_directories(dir);
  fs::copy_file(src / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  std::string st = read_bytes(src / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  st.insert(8 + n, " ");  // JSON allows the trailing space; the data start moves by one byte
  ++n;
  std::memcpy(st.data(), &n, 8);
  write_bytes(dir / "model.safetensors", st);
  const auto shifted = load(dir);
  const auto original = load(src);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(shifted->layers[0].wq.data) % alignof(float), 0u);
  EXPECT_EQ(weight_to_float(shifted->layers[0].wq), weight_to_float(original->layers[0].wq));
  EXPECT_EQ(weight_to_float(shifted->lm_head), weight_to_float(original->lm_head));
  EXPECT_EQ(shifted->final_norm, original->final_norm);
}

}  // namespace
}  // namespace kvlab
