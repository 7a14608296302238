// Where the Engine's layer loop (engine.cpp) runs the dense work and the attention of a
// forward call: the CPU (cpu_backend.cpp), or a device (device_backend.h: the emulated device
// and CUDA). Per call and layer l the loop does
//   begin_call(groups, tokens)                           x = embeddings
//   rows = qkv(l, rope_pos, need_q)                      h = RMSNorm(x); q, k, v; RoPE at rope_pos
//   host: AttentionStep::prepare per group               (append, the policy's selection)
//   attend(groups, l)                                    attention over the selections
//   out = attention_output(need_out)
//   host: AttentionStep::finish per group -> evicted(g, l) when the policy evicted
//   finish_layer(l)                                      x += Wo att; the feed-forward block
// then logits(rows, out). Sequences, policies and the paged store stay on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "framework/engine/sequence.h"

namespace kvlab::engine_detail {

// The call's q, k, v rows on the host: q [n, n_heads * hd] (writable: the pipeline rotates
// rope_at_cache_position queries to their cache rank in place), k and v [n, n_kv_heads * hd].
struct HostRows {
  float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // A call of tokens.size() rows; groups cover them in order (row0 consecutive).
  virtual void begin_call(std::span<const Group> groups, std::span<const int32_t> tokens) = 0;
  // rope_pos [n]: the row's RoPE position, or -1 to leave q and k raw (rope at cache position).
  // q is valid on the host only when need_q.
  virtual HostRows qkv(int layer, std::span<const int32_t> rope_pos, bool need_q) = 0;
  // Attention of every group's rows over its sequence's selection (g.seq->selection), adding
  // key mass into g.seq->key_mass when the policy asks. q as left by the pipeline.
  virtual void attend(std::span<Group> groups, int layer) = 0;
  // The attention output [n, n_heads * hd] on the host; valid only when need_out.
  virtual const float* attention_output(bool need_out) = 0;
  // The policy evicted from (g's sequence, layer): its slot metadata changed.
  virtual void evicted(const Group& g, int layer) {}
  virtual void finish_layer(int layer) = 0;
  // logits [rows.size(), vocab] of the listed rows (host memory).
  virtual void logits(std::span<const int> rows, float* out) = 0;
  // The sequence ended (its blocks go back to the host pool).
  virtual void end_sequence(SeqId seq) {}
};

}  // namespace kvlab::engine_detail
