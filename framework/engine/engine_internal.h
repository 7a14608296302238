// The Engine's per-sequence and per-call state, shared by the CPU forward pass (engine.cpp) and
// the CUDA one (device_forward.cpp). Internal to framework/engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/policy/layer_kv_cache_view.h"
#include "framework/policy/policy.h"

namespace kvlab {

// RoPE inverse frequencies of the model (kernels/cpu/rope.h's rope_inv_freq for its scaling,
// divided by the per-pair factors of GGUF rope_freqs.weight when the model has them):
// angle(position, pair i) = position * inv_freq[i], in double.
std::vector<double> model_rope_inv_freq(const ModelConfig& config);

namespace engine_detail {

// Dense attention of one probed layer over every token the sequence has seen (evicted ones
// included): rows kept here only when probing.
struct ProbeShadow {
  std::vector<float> k, v;         // [n_seen, n_kv_heads, head_dim] keys as stored, values
  std::vector<int64_t> positions;  // [n_seen]
};

struct Sequence {
  SeqId id = -1;
  std::unique_ptr<AttentionPolicy> policy;
  PolicyNeeds needs;
  int64_t n_tokens = 0;
  int64_t decode_steps = 0;
  double set_sum = 0, achieved_sum = 0, set_last = 0, achieved_last = 0;
  double step_set = 0, step_achieved = 0;  // accumulated over the layers of the current step
  int64_t blocks_current = 0, blocks_peak = 0;
  // probe
  std::vector<ProbeShadow> shadow;  // [n_layers] (only probed layers filled)
  bool probing_step = false;
  int64_t probe_samples = 0;
  double recall_sum = 0, recall_min = 1, err_sum = 0, err_max = 0;
  std::vector<LayerProbeStats> layer_probe;  // [n_layers] (only probed layers counted)
  // The layer being computed (filled by Engine::begin_attention, read by the attention and
  // Engine::end_attention); kept here so the buffers are reused from step to step.
  LayerKvCacheView cache_view;        // the policy's view of the layer (LayerStep::cache)
  KeySelection selection;             // arrives select_all(); the policy's choice
  std::vector<float> key_mass;        // [n_kv_heads, n_slots] zeroed when the policy asks
  std::vector<int32_t> key_rope_pos;  // [n_slots, n_kv_heads] cache ranks (rope_at_cache_position)
  std::vector<float> q_probe;         // [n_heads, head_dim] query at its text position (probe)
};

// The rows of one forward call that belong to one sequence, and the step of the layer being
// computed (its buffers live in the Sequence).
struct Group {
  Sequence* seq = nullptr;
  int row0 = 0, n_rows = 0;
  bool decode = false;
  std::vector<int64_t> positions;  // [n_rows] text positions

  // --- the current layer ---
  LayerStep step;
  bool probing = false;               // this layer is probed in this step
  bool probe_layer = false;           // this layer keeps a shadow copy
};

}  // namespace engine_detail
}  // namespace kvlab
