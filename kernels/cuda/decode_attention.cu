// FlashDecoding over the paged store: see decode_attention.h for the contract.
//
// CTA (128 threads = 4 warps) <-> (split, KV head, request). Per tile of kTile selected keys:
//   load:    K, V rows -> shared memory (cp.async, 2 stages; masked rows are zero-filled)
//   scores:  warp w computes heads w and w + 4 of the group, lane = key:  s = (scale q) . k
//   softmax: the head's warp folds the tile max into its running (m, l)  (online_softmax.h)
//            and writes p = exp(s - m) and alpha to shared memory
//   values:  thread (feature pair, key group) accumulates o[g] = alpha o[g] + sum_k p[g,k] v_k
// At the end the key groups are summed, o / l and the LSE go to the split's partial (or to the
// output when there is one split); merge_splits combines the splits by LSE; key_mass_kernel turns
// the saved scores into probabilities with the final LSE.
#include "kernels/cuda/decode_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_tile.cuh"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kDecodeTileKeys;
constexpr int kMaxGroup = kDecodeMaxGroup;
constexpr int kStages = 2;
static_assert(kTile == 32, "the score step maps one key to each lane of a warp");
static_assert(kMaxGroup == 2 * kWarps, "each warp owns two heads of the group");

template <class T, int kHeadDim>
struct DecodeTileShape {
  static constexpr int kVec = kVec16<T>;                  // elements per 16-byte load
  static constexpr int kRowChunks = kHeadDim / kVec;      // 16-byte chunks per K/V row
  static constexpr int kRowStride = kHeadDim + kVec;      // +16 bytes: conflict-free row reads
  static constexpr int kPairs = kHeadDim / 2;             // feature pairs (values step)
  static constexpr int kKeyGroups = kThreads / kPairs;    // threads sharing a feature pair
  static constexpr int kKeysPerGroup = kTile / kKeyGroups;
  static constexpr int kLoadsPerThread = kTile * kRowChunks / kThreads;
  static constexpr size_t kStageElems = size_t(kTile) * kRowStride;  // one K or V tile
  static constexpr size_t kKvBytes = 2 * kStages * kStageElems * sizeof(T);
  static constexpr size_t kSmemBytes = kKvBytes + sizeof(float) * (kMaxGroup * kHeadDim  // q
                                                                   + kMaxGroup * kTile   // p
                                                                   + 3 * kMaxGroup)      // alpha, m, l
                                       + 2 * sizeof(int) * kStages * kTile;  // pos, rope pos
  static_assert(kHeadDim % kVec == 0 && kThreads % kPairs == 0 && kTile % kKeyGroups == 0);
  static_assert((kTile * kRowChunks) % kThreads == 0);
  static_assert(kKvBytes >= sizeof(float) * kKeyGroups * kMaxGroup * kHeadDim,
                "the final reduction reuses the K/V stages");
};

// Chunk c (kVec features) of a key row in shared memory, as floats, rotated to rope_pos
// (pairs (2i, 2i+1) stay inside a chunk; neox pairs (i, i + d/2) read the partner chunk
// c +- d/2/kVec). (a, b) <- (a cos - b sin, a sin + b cos), as kernels/cpu/rope.h.
template <class T, int kHeadDim>
__device__ __forceinline__ void rotated_key_chunk(const T* k_row, int c, int rope_pos,
                                                  const RopeTableView& rope, float* k) {
  using Shape = DecodeTileShape<T, kHeadDim>;
  constexpr int kVec = Shape::kVec, kHalfChunks = Shape::kRowChunks / 2;
  vec16_to_float<T>(*reinterpret_cast<const uint4*>(k_row + c * kVec), k);
  if (!rope.neox) {
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const float2 cs = rope.at(rope_pos, c * (kVec / 2) + j);
      const float a = k[2 * j], b = k[2 * j + 1];
      k[2 * j] = a * cs.x - b * cs.y;
      k[2 * j + 1] = a * cs.y + b * cs.x;
    }
  } else {
    const bool first_half = c < kHalfChunks;
    float partner[kVec];
    vec16_to_float<T>(
        *reinterpret_cast<const uint4*>(k_row + (first_half ? c + kHalfChunks : c - kHalfChunks) * kVec),
        partner);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float2 cs = rope.at(rope_pos, (first_half ? c : c - kHalfChunks) * kVec + j);
      k[j] = first_half ? k[j] * cs.x - partner[j] * cs.y : partner[j] * cs.y + k[j] * cs.x;
    }
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
decode_partial_kernel(const DecodeParams<T> p, const int group, const int keys_per_split,
                      const int max_keys, float* __restrict__ partial_out,
                      float* __restrict__ partial_lse, float* __restrict__ lse_out,
                      float* __restrict__ scores) {
  using Shape = DecodeTileShape<T, kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem);                       // [kStages][kTile][kRowStride]
  T* v_tile = k_tile + kStages * Shape::kStageElems;            // [kStages][kTile][kRowStride]
  float* q_s = reinterpret_cast<float*>(smem + Shape::kKvBytes);  // [kMaxGroup][kHeadDim]
  float* p_s = q_s + kMaxGroup * kHeadDim;                      // [kMaxGroup][kTile]
  float* alpha_s = p_s + kMaxGroup * kTile;                     // [kMaxGroup]
  float* m_s = alpha_s + kMaxGroup;                             // [kMaxGroup]
  float* l_s = m_s + kMaxGroup;                                 // [kMaxGroup]
  int* pos_s = reinterpret_cast<int*>(l_s + kMaxGroup);         // [kStages][kTile] key positions
  int* rope_pos_s = pos_s + kStages * kTile;                     // [kStages][kTile] rope at read

  const int split = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  const int num_kv_heads = p.kv.num_kv_heads;
  const int list = b * num_kv_heads + kv_head;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int qo_head0 = kv_head * group;
  const int n_slots = p.kv.length(b);
  const int count = p.sel.count(list, n_slots);
  const KeySpan span = split_span(count, keys_per_split, split);
  const int64_t q_pos = p.q_pos != nullptr ? p.q_pos[b] : n_slots - 1;

  for (int e = tid; e < group * kHeadDim; e += kThreads)
    q_s[e] = p.q[(size_t(b) * p.num_qo_heads + qo_head0) * kHeadDim + e] * p.scale;

  // The selected keys [n0, n0 + kTile) of the split into a stage (kv_tile.cuh).
  auto load_tile = [&](int stage, int n0) {
    load_kv_tile<Shape::kRowChunks, Shape::kVec, Shape::kLoadsPerThread, kThreads>(
        p, b, kv_head, list, n0, span.end, tid, k_tile + size_t(stage) * Shape::kStageElems,
        v_tile + size_t(stage) * Shape::kStageElems, Shape::kRowStride, pos_s + stage * kTile,
        rope_pos_s + stage * kTile);
  };

  SoftmaxState st[2];  // heads warp and warp + kWarps, held (identically) by every lane
  float2 acc[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) acc[g] = make_float2(0.f, 0.f);
  const int pair = tid % Shape::kPairs, key_group = tid / Shape::kPairs;

  const int n_tiles = (span.end - span.begin + kTile - 1) / kTile;
  if (n_tiles > 0) load_tile(0, span.begin);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % kStages;
    const int n0 = span.begin + it * kTile;
    if (it + 1 < n_tiles) load_tile((it + 1) % kStages, n0 + kTile);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    // Scores and the online-softmax step, one key per lane, two heads per warp.
    const T* k_row = k_tile + size_t(stage) * Shape::kStageElems + size_t(lane) * Shape::kRowStride;
    const int key_pos = pos_s[stage * kTile + lane];
    const bool key_ok = n0 + lane < span.end && key_pos >= 0 && p.mask(q_pos, key_pos);
    const int rope_pos = p.key_rope_pos != nullptr ? max(rope_pos_s[stage * kTile + lane], 0) : -1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int g = warp + h * kWarps;
      if (g >= group) continue;
      // Four partial sums: four independent FMA chains instead of one of head_dim steps.
      float part[4] = {0.f, 0.f, 0.f, 0.f};
      if (rope_pos < 0) {
#pragma unroll
        for (int c = 0; c < Shape::kRowChunks; ++c) {
          float k[Shape::kVec];
          vec16_to_float<T>(*reinterpret_cast<const uint4*>(k_row + c * Shape::kVec), k);
          const float* q = q_s + g * kHeadDim + c * Shape::kVec;
#pragma unroll
          for (int j = 0; j < Shape::kVec; ++j) part[j % 4] = fmaf(q[j], k[j], part[j % 4]);
        }
      } else {  // rope at read: kept rolled so the common path keeps its registers
#pragma unroll 1
        for (int c = 0; c < Shape::kRowChunks; ++c) {
          float k[Shape::kVec];
          rotated_key_chunk<T, kHeadDim>(k_row, c, rope_pos, p.rope, k);
          const float* q = q_s + g * kHeadDim + c * Shape::kVec;
#pragma unroll
          for (int j = 0; j < Shape::kVec; ++j) part[j % 4] = fmaf(q[j], k[j], part[j % 4]);
        }
      }
      const float dot = (part[0] + part[1]) + (part[2] + part[3]);
      const float s = key_ok ? dot : kNegInf;
      float shift;
      const float alpha = softmax_rescale(st[h], warp_max(s), &shift);
      const float prob = key_ok ? __expf(s - shift) : 0.f;
      st[h].l += warp_sum(prob);
      p_s[g * kTile + lane] = prob;
      if (lane == 0) alpha_s[g] = alpha;
      if (scores != nullptr && n0 + lane < span.end && n0 + lane < max_keys)
        scores[(size_t(b) * p.num_qo_heads + qo_head0 + g) * max_keys + n0 + lane] = s;
    }
    __syncthreads();

    // o[g] = alpha[g] o[g] + sum over this thread's keys of p[g, k] v_k (feature pair `pair`).
    const T* v_base = v_tile + size_t(stage) * Shape::kStageElems + 2 * pair;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        acc[g].x *= alpha_s[g];
        acc[g].y *= alpha_s[g];
      }
    }
#pragma unroll
    for (int kk = 0; kk < Shape::kKeysPerGroup; ++kk) {
      const int key = key_group * Shape::kKeysPerGroup + kk;
      const float2 v = pair_to_float2(v_base + size_t(key) * Shape::kRowStride);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float pr = p_s[g * kTile + key];
          acc[g].x = fmaf(pr, v.x, acc[g].x);
          acc[g].y = fmaf(pr, v.y, acc[g].y);
        }
      }
    }
    __syncthreads();  // the stage and p_s are overwritten next
  }
  cp_async_wait<0>();

  // Sum the key groups' accumulators (in the now idle K/V stages), then normalise.
  float* red = reinterpret_cast<float*>(smem);  // [kKeyGroups][kMaxGroup][kHeadDim]
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      float* dst = red + (size_t(key_group) * kMaxGroup + g) * kHeadDim + 2 * pair;
      dst[0] = acc[g].x;
      dst[1] = acc[g].y;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int g = warp + h * kWarps;
      if (g < group) {
        m_s[g] = st[h].m;
        l_s[g] = st[h].l;
      }
    }
  }
  __syncthreads();
  const int num_splits = gridDim.x;
  for (int e = tid; e < group * kHeadDim; e += kThreads) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    float o = 0.f;
#pragma unroll
    for (int kg = 0; kg < Shape::kKeyGroups; ++kg) o += red[(size_t(kg) * kMaxGroup + g) * kHeadDim + d];
    SoftmaxState fin;
    fin.m = m_s[g];
    fin.l = l_s[g];
    o = fin.l > 0.f ? o / fin.l : 0.f;
    const float lse = softmax_lse(fin);
    const size_t row = size_t(b) * p.num_qo_heads + qo_head0 + g;
    if (num_splits == 1) {
      p.out[row * kHeadDim + d] = o;
      if (d == 0) {
        lse_out[row] = lse;
        if (p.lse != nullptr) p.lse[row] = lse;
      }
    } else {
      const size_t prow = size_t(split) * p.batch * p.num_qo_heads + row;
      partial_out[prow * kHeadDim + d] = o;
      if (d == 0) partial_lse[prow] = lse;
    }
  }
}

// One block per (request, query head), one thread per feature: folds the splits in order with
// merge_partial (POLICIES.md section 1 merge).
__global__ void merge_splits_kernel(const float* __restrict__ partial_out,
                                    const float* __restrict__ partial_lse, int num_splits,
                                    int rows, int head_dim, float* __restrict__ out,
                                    float* __restrict__ lse_out, float* __restrict__ lse_user) {
  const int row = blockIdx.x;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.f, lse = kNegInf;
    for (int s = 0; s < num_splits; ++s) {
      const size_t prow = size_t(s) * rows + row;
      const float part = partial_out[prow * head_dim + d];
      merge_partial(&o, lse, &part, partial_lse[prow], 1);
    }
    out[size_t(row) * head_dim + d] = o;
    if (d == 0) {
      lse_out[row] = lse;
      if (lse_user != nullptr) lse_user[row] = lse;
    }
  }
}

// key_mass[list, slot(n)] += sum over the group's heads of exp(s[head, n] - LSE[head]).
template <class T>
__global__ void key_mass_kernel(const DecodeParams<T> p, const int group, const int max_keys,
                                const float* __restrict__ scores, const float* __restrict__ lse) {
  const int list = blockIdx.y;
  const int b = list / p.kv.num_kv_heads, kv_head = list % p.kv.num_kv_heads;
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int count = p.sel.count(list, p.kv.length(b));
  if (n >= count || n >= max_keys) return;
  float mass = 0.f;
  for (int g = 0; g < group; ++g) {
    const size_t row = size_t(b) * p.num_qo_heads + kv_head * group + g;
    const float l = lse[row];
    const float s = scores[row * max_keys + n];
    if (l != kNegInf && s != kNegInf) mass += __expf(s - l);
  }
  p.key_mass[size_t(list) * p.key_mass_stride + p.sel.slot_of(list, n)] += mass;
}

template <class T, int kHeadDim>
void launch_decode(const DecodeParams<T>& p, const DecodePlan& plan, DecodeWorkspace& ws,
                   cudaStream_t stream) {
  using Shape = DecodeTileShape<T, kHeadDim>;
  const int group = p.num_qo_heads / p.kv.num_kv_heads;
  const size_t rows = size_t(p.batch) * p.num_qo_heads;
  ws.lse.reserve(rows);
  if (plan.num_splits > 1) {
    ws.partial_out.reserve(plan.num_splits * rows * kHeadDim);
    ws.partial_lse.reserve(plan.num_splits * rows);
  }
  float* scores = nullptr;
  if (p.key_mass != nullptr) {
    ws.scores.reserve(rows * size_t(plan.max_keys > 0 ? plan.max_keys : 1));
    scores = ws.scores.data();
  }
  allow_dynamic_smem_once_for<decode_partial_kernel<T, kHeadDim>>(Shape::kSmemBytes);
  const dim3 grid(plan.num_splits, p.kv.num_kv_heads, p.batch);
  decode_partial_kernel<T, kHeadDim><<<grid, kThreads, Shape::kSmemBytes, stream>>>(
      p, group, plan.keys_per_split, plan.max_keys, ws.partial_out.data(), ws.partial_lse.data(),
      ws.lse.data(), scores);
  KVLAB_CUDA_CHECK_LAUNCH();
  if (plan.num_splits > 1) {
    merge_splits_kernel<<<static_cast<unsigned>(rows), kHeadDim, 0, stream>>>(
        ws.partial_out.data(), ws.partial_lse.data(), plan.num_splits, static_cast<int>(rows),
        kHeadDim, p.out, ws.lse.data(), p.lse);
    KVLAB_CUDA_CHECK_LAUNCH();
  }
  if (p.key_mass != nullptr && plan.max_keys > 0) {
    const dim3 mgrid((plan.max_keys + 255) / 256, p.batch * p.kv.num_kv_heads);
    key_mass_kernel<T><<<mgrid, 256, 0, stream>>>(p, group, plan.max_keys, scores, ws.lse.data());
    KVLAB_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

DecodePlan plan_decode(int batch, int num_kv_heads, int max_keys, int num_sms) {
  if (num_sms <= 0) {
    int dev = 0;
    KVLAB_CUDA_CHECK(cudaGetDevice(&dev));
    KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  }
  DecodePlan plan;
  plan.max_keys = max_keys;
  // About 32 CTAs per multiprocessor over the launch (5-6 resident at a time for bf16, d 128:
  // several short waves keep the tail small; the merge costs < 1% of the KV bytes), splits of
  // at least 256 keys.
  plan.keys_per_split =
      choose_keys_per_split(max_keys, batch * num_kv_heads, 32 * num_sms, kTile, 8 * kTile);
  plan.num_splits = num_splits_for(max_keys, plan.keys_per_split);
  return plan;
}

template <class T>
void decode_attention(const DecodeParams<T>& p, const DecodePlan& plan, DecodeWorkspace& ws,
                      cudaStream_t stream) {
  const int hkv = p.kv.num_kv_heads;
  if (hkv <= 0 || p.num_qo_heads < hkv || p.num_qo_heads % hkv != 0 || p.num_qo_heads / hkv > kMaxGroup)
    fail("decode_attention: ", p.num_qo_heads, " query heads over ", hkv,
         " KV heads (need a group size of 1..", kMaxGroup, ")");
  if (p.kv.page_size <= 0) fail("decode_attention: page_size must be positive");
  if (p.key_mass != nullptr && p.key_mass_stride <= 0)
    fail("decode_attention: key_mass needs key_mass_stride >= the longest request");
  if (p.key_rope_pos != nullptr &&
      (p.rope.half * 2 != p.kv.head_dim || p.rope.cos_sin == nullptr || p.rope.n_positions <= 0))
    fail("decode_attention: rope at read needs a RopeTableView for head_dim ", p.kv.head_dim);
  if (plan.keys_per_split % kTile != 0 || plan.num_splits < 1)
    fail("decode_attention: plan not made by plan_decode");
  if (p.batch == 0) return;
  switch (p.kv.head_dim) {
    case 64: launch_decode<T, 64>(p, plan, ws, stream); break;
    case 128: launch_decode<T, 128>(p, plan, ws, stream); break;
    default: fail("decode_attention: head_dim ", p.kv.head_dim, " unsupported (64 or 128)");
  }
}

template void decode_attention<float>(const DecodeParams<float>&, const DecodePlan&,
                                      DecodeWorkspace&, cudaStream_t);
template void decode_attention<__half>(const DecodeParams<__half>&, const DecodePlan&,
                                       DecodeWorkspace&, cudaStream_t);
template void decode_attention<__nv_bfloat16>(const DecodeParams<__nv_bfloat16>&,
                                              const DecodePlan&, DecodeWorkspace&, cudaStream_t);

}  // namespace kvlab::cuda
