// The engine on block-quantised weights (kernels/cpu/quant_blocks.h), per-tensor mixes as GGUF
// files have them, against the same model with every matrix dequantised to fp32:
//   - prefill of >= kGemmMinTokens tokens runs sgemm on dequantised panels (and the embedding
//     lookup dequantises a row): the same weights in fp32, so the logits agree within two fp32
//     passes (2 x logit_bound);
//   - decode runs the integer matvec on int8 activations: within the activation-quantisation
//     bound derived below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <span>
#include <string>

#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {
namespace {

// A per-matrix type plan: part name ("tok_embeddings", "lm_head", "wq", ..., "w_down") -> type.
using Plan = std::map<std::string, DType>;

WeightView store(Model& m, const WeightView& f32, DType t) {
  const size_t bytes = dtype_bytes(t, f32.rows * f32.cols);
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[bytes]);
  if (t == DType::kF32) std::memcpy(buf.get(), f32.data, bytes);
  else from_float(t, static_cast<const float*>(f32.data), buf.get(), f32.rows * f32.cols);
  m.storage.push_back(std::shared_ptr<const void>(buf, buf.get()));
  return WeightView{t, f32.rows, f32.cols, buf.get()};
}

WeightView dequantised(Model& m, const WeightView& w) {
  auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(w.rows * w.cols)]);
  for (int64_t r = 0; r < w.rows; ++r) to_float(w.dtype, w.row(r), buf.get() + r * w.cols, w.cols);
  m.storage.push_back(std::shared_ptr<const void>(buf, buf.get()));
  return WeightView{DType::kF32, w.rows, w.cols, buf.get()};
}

// Applies `plan` to a fp32 random model in place; `deq` (the same random model) gets the
// quantised matrices dequantised back to fp32.
void apply(Model& q, Model& deq, const Plan& plan) {
  auto one = [&](const char* part, WeightView& wq, WeightView& wd) {
    const DType t = plan.count(part) ? plan.at(part) : plan.at("default");
    wq = store(q, wq, t);
    wd = dequantised(deq, wq);
  };
  one("tok_embeddings", q.tok_embeddings, deq.tok_embeddings);
  if (q.config.tied_embeddings) q.lm_head = q.tok_embeddings, deq.lm_head = deq.tok_embeddings;
  else one("lm_head", q.lm_head, deq.lm_head);
  for (size_t l = 0; l < q.layers.size(); ++l) {
    LayerWeights &a = q.layers[l], &b = deq.layers[l];
    one("wq", a.wq, b.wq), one("wk", a.wk, b.wk), one("wv", a.wv, b.wv), one("wo", a.wo, b.wo);
    one("w_gate", a.w_gate, b.w_gate), one("w_up", a.w_up, b.w_up), one("w_down", a.w_down, b.w_down);
  }
}

std::vector<float> decode_all(const Model& m, const std::vector<int32_t>& tokens) {
  return decode_logits(m, tokens, 16);
}

struct PlanCase {
  const char* name;
  Plan plan;
  int64_t max_block;  // the largest block among the plan's types (sets eps_B)
  bool tied;
};

std::vector<PlanCase> plans() {
  std::vector<PlanCase> out;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K})
    out.push_back({dtype_name(t), Plan{{"default", t}}, quant_block_values(t), true});
  // as llama.cpp's Q4_K_M: Q6_K in attn_v / ffn_down / output, Q4_K elsewhere
  out.push_back({"q4_k_m-like", Plan{{"default", DType::kQ4_K}, {"wv", DType::kQ6_K}, {"w_down", DType::kQ6_K},
                                     {"lm_head", DType::kQ6_K}}, 256, false});
  // 32-value types beside K types, q8_0 embeddings, an fp32 lm_head
  out.push_back({"mixed", Plan{{"default", DType::kQ5_0}, {"wq", DType::kQ4_1}, {"wk", DType::kQ5_1},
                               {"w_up", DType::kQ5_K}, {"w_gate", DType::kQ4_0}, {"tok_embeddings", DType::kQ8_0},
                               {"lm_head", DType::kF32}}, 256, false});
  return out;
}

TEST(EngineQuant, MixedQuantisedModelsMatchTheirDequantisedTwin) {
  for (const PlanCase& pc : plans()) {
    ModelConfig c = tiny_llama_config(300, 64, 4, 2, 64);
    c.dim = 256;
    c.hidden_dim = 512;
    c.tied_embeddings = pc.tied;
    auto q = make_random_model(c, DType::kF32, 21);
    auto deq = make_random_model(c, DType::kF32, 21);
    apply(*q, *deq, pc.plan);
    const auto tokens = random_tokens(12, c.vocab_size, 5);

    const auto pq = prefill_logits(*q, tokens), pd = prefill_logits(*deq, tokens);
    const double pbound = 2 * logit_bound(*deq, tokens.size());
    double pmax = 0;
    for (size_t i = 0; i < pq.size(); ++i) pmax = std::max(pmax, std::fabs(double(pq[i]) - pd[i]));
    EXPECT_LE(pmax, pbound) << pc.name << " prefill";

    const auto dq = decode_all(*q, tokens), dd = decode_all(*deq, tokens);
    ASSERT_EQ(dq.size(), dd.size());
    double worst = 0, logit_rms = 0;
    for (size_t i = 0; i < dq.size(); ++i) {
      ASSERT_TRUE(std::isfinite(dq[i])) << pc.name;
      const int64_t v = static_cast<int64_t>(i % c.vocab_size);
      const double bound = activation_quant_logit_bound(*deq, pc.max_block, v, tokens.size());
      worst = std::max(worst, std::fabs(double(dq[i]) - dd[i]) / bound);
      logit_rms += double(dd[i]) * dd[i];
      ASSERT_LE(std::fabs(double(dq[i]) - dd[i]), bound) << pc.name << " logit " << i;
    }
    std::printf("%-12s prefill max |diff| %.3g (bound %.3g); decode worst |diff| / bound %.3f, logit rms %.3g\n",
                pc.name, pmax, pbound, worst, std::sqrt(logit_rms / dq.size()));
  }
}

}  // namespace
}  // namespace kvlab
