// Kernels of landmark.h. landmark_select: one CTA of 256 threads per (KV head, request).
//   pass 1 (kSoftmaxMax only): per head, N_h = logsumexp(local_lse, z[h, *]) by an online
//           max/sum per warp, merged across warps;
//   pass 2: score[c] into shared memory (warp per chunk, lanes over features: coalesced rows);
//   top-k:  K rounds of a block argmax (higher score, then lower index), winners flagged;
//   write:  one thread lists the flagged chunks in ascending order.
#include "kernels/cuda/landmark.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxFeatPerLane = kMaxHeadDim / 32;

// z[g] for chunk c, all heads of the group, computed by one warp; every lane returns the sums.
__device__ void chunk_logits(const LandmarkSelectParams& p, const float* q_s, int group, int b,
                             int kv, int c, int lane, float (&z)[kMaxGroup]) {
  const size_t row = ((size_t(b) * p.num_kv_heads + kv) * p.max_chunks + c) * p.head_dim;
  float lmax[kMaxFeatPerLane], lmin[kMaxFeatPerLane];
  const int per_lane = p.head_dim / 32;
#pragma unroll
  for (int i = 0; i < kMaxFeatPerLane; ++i) {
    if (i < per_lane) {
      lmax[i] = p.landmarks[row + i * 32 + lane];
      lmin[i] = p.landmarks_min != nullptr ? p.landmarks_min[row + i * 32 + lane] : 0.f;
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxFeatPerLane; ++i) {
      if (i < per_lane) {
        const float qd = q_s[g * p.head_dim + i * 32 + lane];
        acc += p.landmarks_min != nullptr ? fmaxf(qd * lmax[i], qd * lmin[i]) : qd * lmax[i];
      }
    }
    z[g] = warp_sum(acc);
    if (p.bias != nullptr && p.landmarks_min == nullptr)
      z[g] += p.bias[(size_t(b) * p.num_kv_heads + kv) * p.max_chunks + c];
  }
}

// (score, index) order: a before b when a.score > b.score, or equal and a.index < b.index.
__device__ __forceinline__ bool better(float sa, int ia, float sb, int ib) {
  return sa > sb || (sa == sb && ia >= 0 && (ib < 0 || ia < ib));
}

__global__ void __launch_bounds__(kThreads) landmark_select_kernel(const LandmarkSelectParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int kv = blockIdx.x, b = blockIdx.y;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* q_s = reinterpret_cast<float*>(smem);            // [group][head_dim], scaled
  float* norm_s = q_s + kMaxGroup * kMaxHeadDim;          // [kMaxGroup] N_h
  float* wm_s = norm_s + kMaxGroup;                       // [kWarps][kMaxGroup] warp max
  float* wl_s = wm_s + kWarps * kMaxGroup;                // [kWarps][kMaxGroup] warp sum
  float* red_score = wl_s + kWarps * kMaxGroup;           // [kWarps]
  int* red_index = reinterpret_cast<int*>(red_score + kWarps);  // [kWarps]
  float* score = reinterpret_cast<float*>(red_index + kWarps);  // [max_chunks]
  int* taken = reinterpret_cast<int*>(score + p.max_chunks);    // [max_chunks]

  int n = p.n_eligible[b];
  n = n < 0 ? 0 : (n > p.max_chunks ? p.max_chunks : n);
  const int k = p.top_k < n ? p.top_k : n;
  for (int e = tid; e < group * p.head_dim; e += kThreads)
    q_s[e] = p.q[(size_t(b) * p.num_qo_heads + kv * group) * p.head_dim + e] * p.scale;
  for (int c = tid; c < n; c += kThreads) taken[c] = 0;
  __syncthreads();

  // Pass 1: N_h (only the softmax aggregation needs it).
  const bool normalise = p.aggregation == LandmarkAggregation::kSoftmaxMax;
  if (normalise) {
    SoftmaxState st[kMaxGroup];
    for (int c = warp; c < n; c += kWarps) {
      float z[kMaxGroup];
      chunk_logits(p, q_s, group, b, kv, c, lane, z);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        float shift;
        softmax_rescale(st[g], z[g], &shift);
        st[g].l += __expf(z[g] - shift);
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        wm_s[warp * kMaxGroup + g] = st[g].m;
        wl_s[warp * kMaxGroup + g] = st[g].l;
      }
    }
    __syncthreads();
    if (tid < group) {
      const int g = tid;
      // Fold the local region's LSE and every warp's (m, l) by the split merge (dim 0).
      float lse = p.local_lse != nullptr ? p.local_lse[size_t(b) * p.num_qo_heads + kv * group + g] : kNegInf;
      for (int w = 0; w < kWarps; ++w) {
        SoftmaxState part;
        part.m = wm_s[w * kMaxGroup + g];
        part.l = wl_s[w * kMaxGroup + g];
        merge_partial(nullptr, lse, nullptr, softmax_lse(part), 0);
      }
      norm_s[g] = lse;
    }
    __syncthreads();
  }

  // Pass 2: one score per chunk.
  for (int c = warp; c < n; c += kWarps) {
    float z[kMaxGroup];
    chunk_logits(p, q_s, group, b, kv, c, lane, z);
    float s = p.aggregation == LandmarkAggregation::kSum ? 0.f : kNegInf;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
      if (p.aggregation == LandmarkAggregation::kSum) {
        s += z[g];
      } else {
        s = fmaxf(s, normalise ? z[g] - norm_s[g] : z[g]);
      }
    }
    if (lane == 0) score[c] = s;
  }
  __syncthreads();

  // Top-k by K rounds of a block argmax (skipped when every chunk is taken).
  if (k >= n) {
    for (int c = tid; c < n; c += kThreads) taken[c] = 1;
  } else {
    for (int round = 0; round < k; ++round) {
      float best_s = kNegInf;
      int best_i = -1;
      for (int c = tid; c < n; c += kThreads)
        if (!taken[c] && better(score[c], c, best_s, best_i)) {
          best_s = score[c];
          best_i = c;
        }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float os = __shfl_xor_sync(0xffffffffu, best_s, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (better(os, oi, best_s, best_i)) {
          best_s = os;
          best_i = oi;
        }
      }
      if (lane == 0) {
        red_score[warp] = best_s;
        red_index[warp] = best_i;
      }
      __syncthreads();
      if (tid == 0) {
        for (int w = 1; w < kWarps; ++w)
          if (better(red_score[w], red_index[w], best_s, best_i)) {
            best_s = red_score[w];
            best_i = red_index[w];
          }
        if (best_i >= 0) taken[best_i] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (tid == 0) {
    int32_t* out = p.selected + (size_t(b) * p.num_kv_heads + kv) * p.top_k;
    int m = 0;
    for (int c = 0; c < n && m < p.top_k; ++c)
      if (taken[c]) out[m++] = c;
    for (int i = m; i < p.top_k; ++i) out[i] = -1;
    p.n_selected[size_t(b) * p.num_kv_heads + kv] = m;
  }
}

size_t select_smem_bytes(int max_chunks) {
  return sizeof(float) * (kMaxGroup * kMaxHeadDim + kMaxGroup + 2 * kWarps * kMaxGroup + kWarps) +
         sizeof(int) * kWarps + (sizeof(float) + sizeof(int)) * size_t(max_chunks);
}

// One block per (item, KV head); threads over features, looping over the chunk's slots.
template <class T>
__global__ void landmark_mean_kernel(const PagedKvView<const T> kv, const int32_t* __restrict__ kv_pos,
                                     int chunk_size, const int32_t* __restrict__ req,
                                     const int32_t* __restrict__ chunk, float* __restrict__ out) {
  const int item = blockIdx.x, head = blockIdx.y;
  const int b = req[item];
  const int first = chunk[item] * chunk_size;
  int last = first + chunk_size;
  const int len = kv.length(b);
  last = last < len ? last : len;
  for (int f = threadIdx.x; f < kv.head_dim; f += blockDim.x) {
    float sum = 0.f;
    int valid = 0;
    for (int s = first; s < last; ++s) {
      if (kv_pos != nullptr && kv_pos[kv.slot_meta_offset(b, s, head)] < 0) continue;
      sum += to_float(kv.k_data[kv.slot_offset(b, s, head) + f]);
      ++valid;
    }
    out[(size_t(item) * kv.num_kv_heads + head) * kv.head_dim + f] = valid > 0 ? sum / valid : 0.f;
  }
}

}  // namespace

void landmark_select(const LandmarkSelectParams& p, cudaStream_t stream) {
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0 ||
      p.num_qo_heads / p.num_kv_heads > kMaxGroup)
    fail("landmark_select: ", p.num_qo_heads, " query heads over ", p.num_kv_heads,
         " KV heads (group size 1..", kMaxGroup, ")");
  if (p.head_dim <= 0 || p.head_dim % 32 != 0 || p.head_dim > kMaxHeadDim)
    fail("landmark_select: head_dim ", p.head_dim, " unsupported (a multiple of 32, <= ", kMaxHeadDim, ")");
  if (p.top_k < 1) fail("landmark_select: top_k must be >= 1");
  if (p.batch == 0) return;
  const size_t smem = select_smem_bytes(p.max_chunks);
  int dev = 0, max_smem = 0;
  KVLAB_CUDA_CHECK(cudaGetDevice(&dev));
  KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > size_t(max_smem))
    fail("landmark_select: ", p.max_chunks, " chunks need ", smem, " bytes of shared memory, the device has ", max_smem);
  KVLAB_CUDA_CHECK(cudaFuncSetAttribute(landmark_select_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  landmark_select_kernel<<<dim3(p.num_kv_heads, p.batch), kThreads, smem, stream>>>(p);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void landmark_mean(const PagedKvView<const T>& kv, const int32_t* kv_pos, int chunk_size,
                   const int32_t* req, const int32_t* chunk, int n_items, float* out,
                   cudaStream_t stream) {
  if (chunk_size <= 0) fail("landmark_mean: chunk_size must be positive");
  if (n_items <= 0) return;
  landmark_mean_kernel<T><<<dim3(n_items, kv.num_kv_heads), 128, 0, stream>>>(kv, kv_pos, chunk_size,
                                                                                req, chunk, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template void landmark_mean<float>(const PagedKvView<const float>&, const int32_t*, int,
                                   const int32_t*, const int32_t*, int, float*, cudaStream_t);
template void landmark_mean<__half>(const PagedKvView<const __half>&, const int32_t*, int,
                                    const int32_t*, const int32_t*, int, float*, cudaStream_t);
template void landmark_mean<__nv_bfloat16>(const PagedKvView<const __nv_bfloat16>&, const int32_t*,
                                           int, const int32_t*, const int32_t*, int, float*,
                                           cudaStream_t);

}  // namespace kvlab::cuda
