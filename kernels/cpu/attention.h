// Attention over a paged KV cache on the CPU: a plain reference and a tiled fast path.
//
// For every query row r (position P_r = q_positions[r]) and query head h, reading KV head
// g = h / G (G = n_heads / n_kv_heads), the keys read are
//   J(r, h) = { slot s in the selection of (r, g) : valid(s, g) and position(s, g) <= P_r }
// (selection == nullptr or selection->all: every slot). With tau = scale:
//   s_j = tau * q_{r,h} . k_j      (k_j rotated to key_rope_pos[j, g] first when `rope` is set)
//   s_j <- c * tanh(s_j / c)       with c = softcap > 0 (Gemma 2), else unchanged
//   LSE = log sum_{j in J} exp(s_j);   p_j = exp(s_j - LSE);   out_{r,h} = sum_j p_j v_j
// An empty J gives out = 0 and LSE = -inf (never NaN).
// key_mass (optional) accumulates, for every slot j and KV head g,
//   key_mass[g * n_slots + j] += sum_r sum_{h in group g} p_j(r, h)
// i.e. H2O's per-step column sums (POLICIES.md section 5), the group summed under GQA.
// head_mass (optional) accumulates the same per QUERY head over the last rows only,
//   head_mass[h * n_slots + j] += sum_{r >= head_mass_first_row} p_j(r, h)
// (StepStats::window_attention: SnapKV's observation window, TOVA's last query).
//
// attention_naive materialises each score row (the reference). attention() never does: it walks
// the keys tile by tile with the online-softmax recurrence (kernels/common/online_softmax.h),
// loading each key once for all query vectors that share it (the G heads of a group, and with a
// full selection several rows), with AVX2+FMA dot products and exp (or, on the portable path
// of a CPU without them, plain loops and std::exp). Its output does not depend on
// the tile size beyond float rounding. key_mass and head_mass read no key twice: the raw scores of
// a work item are kept in per-thread scratch and turned into exp(s_j - LSE) once the item's LSEs
// are known. The threads of a ThreadPool (the engine's own: no second team spins beside it) split
// work items (block of rows, KV head); with several threads each item's sums are buffered and
// added per KV head in item order.
// Results (out, lse, key_mass, head_mass) are bitwise independent of n_threads.
//
// Contract: the ranges of the rows read lie in [0, n_slots) (std::invalid_argument otherwise);
// the selection has n_kv_heads lists per row and rows [selection_row, selection_row + n_rows).
// The kernels are pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/common/selection.h"
#include "kernels/common/layer_kv.h"
#include "kernels/cpu/cpu_path.h"
#include "kernels/cpu/rope.h"

namespace kvlab {

struct AttentionArgs {
  const float* q = nullptr;       // [n_rows, n_heads, head_dim], rotated, unscaled
  int n_rows = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const int64_t* q_positions = nullptr;  // [n_rows] causal: key position <= query position
  LayerKv kv;                            // keys/values + slot metadata
  const KeySelection* selection = nullptr;  // nullptr or all => every valid causal slot
  // Row r reads the lists of selection row selection_row + r (a device launch's selection holds
  // one row per request, kernels/common/selection.h; the emulator attends request by request).
  int selection_row = 0;
  float scale = 1.f;                     // 1/sqrt(head_dim)
  // Gemma 2's attention-logit soft-capping: s_j <- softcap * tanh(s_j / softcap) before the
  // softmax (and in key_mass / head_mass); 0 = none. A scalar pass over each tile's scores.
  float softcap = 0.f;
  // Rope at read (policies with rope_at_cache_position): keys are stored raw and key (slot s,
  // head g) is rotated to position key_rope_pos[s * n_kv_heads + g] before the dot product.
  const int32_t* key_rope_pos = nullptr;  // [n_slots, n_kv_heads]
  const RopeTable* rope = nullptr;
  float* out = nullptr;       // [n_rows, n_heads, head_dim]
  float* lse = nullptr;       // optional [n_rows, n_heads], natural log
  float* key_mass = nullptr;  // optional [n_kv_heads, n_slots], accumulated (+=)
  float* head_mass = nullptr;  // optional [n_heads, n_slots], accumulated (+=) over rows >= ...
  int head_mass_first_row = 0;  // ... this one, in [0, n_rows]
};

// The fields every call sets: q [n_rows, n_heads, head_dim] at q_positions [n_rows] over kv,
// scores scaled by `scale`; the rest (selection, rope at read, outputs) stays default.
inline AttentionArgs attention_args(const float* q, int n_rows, int n_heads, int n_kv_heads,
                                    int head_dim, const int64_t* q_positions, const LayerKv& kv,
                                    float scale) {
  AttentionArgs a;
  a.q = q;
  a.n_rows = n_rows, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
  a.q_positions = q_positions;
  a.kv = kv;
  a.scale = scale;
  return a;
}

class ThreadPool;

void attention_naive(const AttentionArgs& args);  // reference
// Tiled online softmax on the pool's threads (nullptr: the calling thread alone). The pool runs
// one job at a time: the caller must not be inside one of its jobs.
void attention(const AttentionArgs& args, ThreadPool* pool);
// The same on n_threads threads of a pool kept per process (for tests and benchmarks; calls
// from several threads are serialised), 1: the calling thread alone.
void attention(const AttentionArgs& args, int n_threads = 1);
// The same on a chosen instruction-set path (cpu_path.h); attention() above takes cpu_path().
// kAvx2 on a CPU without AVX2+FMA+F16C: std::invalid_argument.
void attention(const AttentionArgs& args, ThreadPool* pool, CpuPath path);
void attention(const AttentionArgs& args, int n_threads, CpuPath path);

// StreamingLLM's "positions inside the cache": out[s * n_kv_heads + g] = number of valid slots
// of head g before slot s (its rank among the cached tokens); holes get -1. The query then takes
// position = number of valid slots.
void cache_rank_positions(const LayerKv& kv, int32_t* out);

}  // namespace kvlab
