// The Engine's per-sequence state and the rows of one forward call that belong to one sequence
// (a Group), shared by the layer loop (engine.cpp), the attention-step pipeline
// (attention_step.h), its observers and the backends. Internal to framework/engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/policy/layer_kv_cache_view.h"
#include "framework/policy/policy.h"

namespace kvlab::engine_detail {

// What BudgetObserver counts (engine.h SequenceStats "attended"): per decode step, summed over
// layers, then averaged.
struct AttendedCounts {
  double step_set = 0, step_achieved = 0;  // accumulated over the layers of the current step
  double set_sum = 0, achieved_sum = 0, set_last = 0, achieved_last = 0;
};

// Dense attention of one probed layer over every token the sequence has seen (evicted ones
// included): rows kept here only when probing.
struct ProbeShadow {
  std::vector<float> k, v;         // [n_seen, n_kv_heads, head_dim] keys as stored, values
  std::vector<int64_t> positions;  // [n_seen]
};

// What ProbeObserver keeps (engine.h SequenceStats "probe").
struct ProbeState {
  std::vector<ProbeShadow> shadow;  // [n_layers] (only probed layers filled); empty: no probe
  bool probing_step = false;        // this decode step is probed
  int64_t samples = 0;
  double recall_sum = 0, recall_min = 1, err_sum = 0, err_max = 0;
  std::vector<LayerProbeStats> layer;  // [n_layers] (only probed layers counted)
  std::vector<float> q;                // [n_heads, head_dim] query at its text position
};

struct Sequence {
  SeqId id = -1;
  std::unique_ptr<AttentionPolicy> policy;
  PolicyNeeds needs;
  uint64_t seed = 0;                  // LayerStep::seed
  int64_t n_tokens = 0;
  int64_t decode_steps = 0;
  int64_t blocks_current = 0, blocks_peak = 0;
  AttendedCounts attended;
  std::vector<int64_t> resident_at_prompt_end;  // SequenceStats
  std::vector<int64_t> resident_bytes_at_prompt_end;
  int64_t tokens_at_prompt_end = 0;
  ProbeState probe;
  // The layer being computed (filled by AttentionStep::prepare, read by the backend's attention
  // and AttentionStep::finish); kept here so the buffers are reused from step to step.
  LayerKvCacheView cache_view;        // the policy's view of the layer (LayerStep::cache)
  KeySelection selection;             // arrives select_all(); the policy's choice
  std::vector<float> key_mass;        // [n_kv_heads, n_slots] zeroed when the policy asks
  std::vector<float> window_attention;  // [n_heads, n_slots] (PolicyNeeds::observation_window)
  int window_rows = 0;                // rows of this layer's observation window (0: none now)
  bool window_by_kernel = false;      // the backend's attention filled window_attention
  std::vector<int32_t> key_rope_pos;  // [n_slots, n_kv_heads] cache ranks (rope_at_cache_position)
};

// The rows of one forward call that belong to one sequence, and the step of the layer being
// computed (its buffers live in the Sequence).
struct Group {
  Sequence* seq = nullptr;
  int row0 = 0, n_rows = 0;
  bool decode = false;
  bool prompt_end = false;         // the last row ends the prompt (LayerStep::prompt_end)
  std::vector<int64_t> positions;  // [n_rows] text positions
  const float* q = nullptr;        // [n_rows, n_heads, hd] this layer's queries (host, prepare)
  LayerStep step;                  // the current layer
};

}  // namespace kvlab::engine_detail
