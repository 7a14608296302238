// FlashAttention-2 style prefill over the paged store: see prefill_attention.h.
//
// Warp w of a CTA owns query rows [16w, 16w + 16) of the CTA's 64. mma.sync m16n8k16 fragment
// layout (g = lane / 4, t = lane % 4):
//   A (16x16, row): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8, col):  b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8..2t+9, n g)
//   C (16x8):       c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
// So S = Q K^T takes B straight from K rows in shared memory (32-bit loads), the C tiles of two
// neighbouring 8-key blocks of P = exp(S - m) are exactly the A fragment of the next MMA (P V),
// which never leaves registers, and V's B fragments come from ldmatrix.trans of V rows. Each thread holds two rows (g, g + 8): their running max
// is reduced over the 4 threads of a quad; their denominators stay per thread until the end.
#include "kernels/cuda/prefill_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_tile.cuh"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 64;   // query rows per CTA (16 per warp)
constexpr int kKeys = 64;   // keys per tile
constexpr int kStages = 2;

template <class T, int kHeadDim>
struct PrefillShape {
  static_assert(sizeof(T) == 2, "tensor-core path: 16-bit inputs");
  static constexpr int kVec = 8;                     // elements per 16-byte copy
  static constexpr int kRowChunks = kHeadDim / kVec;
  static constexpr int kStride = kHeadDim + kVec;    // +16 bytes: conflict-free fragment loads
  static constexpr int kTileElems = kRows * kStride; // == kKeys * kStride
  static constexpr int kLoadsPerThread = kRows * kRowChunks / kThreads;
  static constexpr int kQkSteps = kHeadDim / 16;     // k-steps of S = Q K^T
  static constexpr int kKeyBlocks = kKeys / 8;       // n-tiles of S
  static constexpr int kPvSteps = kKeys / 16;        // k-steps of O = P V
  static constexpr int kOutBlocks = kHeadDim / 8;    // n-tiles of O (loaded two at a time)
  static constexpr size_t kSmemBytes =
      sizeof(T) * size_t(kTileElems) * (1 + 2 * kStages) + 2 * sizeof(int) * kStages * kKeys;
  static_assert(kRows == kKeys && (kRows * kRowChunks) % kThreads == 0 && kOutBlocks % 2 == 0);
};

template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit values (lo in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack_floats(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
// Four 8x8 tiles of 16-bit elements from shared memory, transposed: lane L gives the address
// of row L % 8 of tile L / 8 (16 contiguous bytes); register i receives, for tile i, the
// elements (row 2t, col g) and (row 2t + 1, col g), g = lane / 4, t = lane % 4: exactly the B
// fragment (k = 2t..2t+1, n = g) of m16n8k16 when the tile's rows are k and its columns n.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
template <class T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const PrefillParams<T> p) {
  using Shape = PrefillShape<T, kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);                     // [kRows][kStride]
  T* k_s = q_s + Shape::kTileElems;                        // [kStages][kKeys][kStride]
  T* v_s = k_s + kStages * Shape::kTileElems;              // [kStages][kKeys][kStride]
  int* kpos_s = reinterpret_cast<int*>(v_s + kStages * Shape::kTileElems);  // [kStages][kKeys]
  int* rope_pos_s = kpos_s + kStages * kKeys;                                // [kStages][kKeys]

  const int head = blockIdx.y, b = blockIdx.z;
  const int row_begin = p.qo_indptr[b], n_rows = p.qo_indptr[b + 1] - row_begin;
  // Longest (last, under the causal mask) row tiles first, so they do not trail the launch.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (r0 >= n_rows) return;
  const int num_kv_heads = p.kv.num_kv_heads;
  const int kv_head = head / (p.num_qo_heads / num_kv_heads);
  const int list = b * num_kv_heads + kv_head;
  const int n_slots = p.kv.length(b);
  auto row_pos = [&](int r) -> int64_t {
    return p.q_pos != nullptr ? p.q_pos[row_begin + r] : int64_t(n_slots) - n_rows + r;
  };
  const int last_row = (n_rows < r0 + kRows ? n_rows : r0 + kRows) - 1;
  const int64_t min_q_pos = row_pos(r0), max_q_pos = row_pos(last_row);
  const int count = p.sel.count(list, n_slots);
  const int n_end = keys_up_to_slot(p.sel, list, count, max_q_pos);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  // Q tile (rows past the request read as zeros).
#pragma unroll
  for (int i = 0; i < Shape::kLoadsPerThread; ++i) {
    const int c = tid + i * kThreads;
    const int row = c / Shape::kRowChunks, col = c % Shape::kRowChunks;
    const bool ok = r0 + row < n_rows;
    const T* src = ok ? p.q + (size_t(row_begin + r0 + row) * p.num_qo_heads + head) * kHeadDim +
                            col * Shape::kVec
                      : p.q;
    cp_async_16(q_s + row * Shape::kStride + col * Shape::kVec, src, ok);
  }
  // The selected keys [n0, n0 + kKeys) into a stage (kv_tile.cuh); rows past n_end read as
  // zeros and are masked at compute time (n0 + col < n_end).
  auto load_tile = [&](int stage, int n0) {
    load_kv_tile<Shape::kRowChunks, Shape::kVec, Shape::kLoadsPerThread, kThreads>(
        p, b, kv_head, list, n0, n_end, tid, k_s + size_t(stage) * Shape::kTileElems,
        v_s + size_t(stage) * Shape::kTileElems, Shape::kStride, kpos_s + stage * kKeys,
        rope_pos_s + stage * kKeys);
  };

  // This thread's two rows: local 16w + g and 16w + g + 8 (position -1 past the request: every
  // key is masked for it and nothing is written).
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  const int64_t pos_a = r0 + row_a < n_rows ? row_pos(r0 + row_a) : -1;
  const int64_t pos_b = r0 + row_b < n_rows ? row_pos(r0 + row_b) : -1;

  uint32_t q_frag[Shape::kQkSteps][4];
  float o[Shape::kOutBlocks][4];
#pragma unroll
  for (int dn = 0; dn < Shape::kOutBlocks; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  SoftmaxState st[2];

  const int n_tiles = (n_end + kKeys - 1) / kKeys;
  if (n_tiles > 0) load_tile(0, 0);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % kStages, n0 = it * kKeys;
    if (it + 1 < n_tiles) load_tile((it + 1) % kStages, n0 + kKeys);
    cp_async_commit();
    cp_async_wait<1>();
    // A tile needs no per-element mask when every key is in range, valid and at a position
    // <= the CTA's first query position (causal, no window): each thread checks the key
    // positions it copied itself (visible to it after its own wait), the barrier ANDs them.
    bool my_keys_full = p.mask.window <= 0;
#pragma unroll
    for (int i = 0; i < Shape::kLoadsPerThread; ++i) {
      const int c = tid + i * kThreads;
      if (c % Shape::kRowChunks == 0) {
        const int row = c / Shape::kRowChunks;
        const int key_pos = kpos_s[stage * kKeys + row];
        my_keys_full = my_keys_full && n0 + row < n_end && key_pos >= 0 && key_pos <= min_q_pos;
      }
    }
    const bool full_tile = __syncthreads_and(my_keys_full) != 0;
    if (it == 0) {
#pragma unroll
      for (int kc = 0; kc < Shape::kQkSteps; ++kc) {
        const T* qa = q_s + row_a * Shape::kStride + kc * 16 + 2 * t;
        const T* qb = q_s + row_b * Shape::kStride + kc * 16 + 2 * t;
        q_frag[kc][0] = load_pair(qa);
        q_frag[kc][1] = load_pair(qb);
        q_frag[kc][2] = load_pair(qa + 8);
        q_frag[kc][3] = load_pair(qb + 8);
      }
    }
    T* ks = k_s + stage * Shape::kTileElems;
    const T* vs = v_s + stage * Shape::kTileElems;
    const int* kpos = kpos_s + stage * kKeys;
    if (p.key_rope_pos != nullptr) {
      // Rope at read: rotate every (key, pair) of the tile in place, in fp32.
      const int half = kHeadDim / 2;
      for (int e = tid; e < kKeys * half; e += kThreads) {
        const int key = e / half, i = e % half;
        const int rp = rope_pos_s[stage * kKeys + key];
        const float2 cs = p.rope.at(rp > 0 ? rp : 0, i);
        T* a_ptr = ks + key * Shape::kStride + (p.rope.neox ? i : 2 * i);
        T* b_ptr = ks + key * Shape::kStride + (p.rope.neox ? i + half : 2 * i + 1);
        const float a = to_float(*a_ptr), bb = to_float(*b_ptr);
        *a_ptr = from_float<T>(a * cs.x - bb * cs.y);
        *b_ptr = from_float<T>(a * cs.y + bb * cs.x);
      }
      __syncthreads();
    }

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[Shape::kKeyBlocks][4];
#pragma unroll
    for (int j = 0; j < Shape::kKeyBlocks; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < Shape::kQkSteps; ++kc) {
#pragma unroll
      for (int j = 0; j < Shape::kKeyBlocks; ++j) {
        const T* krow = ks + (8 * j + g) * Shape::kStride + kc * 16 + 2 * t;
        mma_16816<T>(s[j], q_frag[kc], load_pair(krow), load_pair(krow + 8));
      }
    }

    // Scale, mask, and the online-softmax step for the two rows.
    float row_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < Shape::kKeyBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * p.scale;
        if (!full_tile) {
          const int col = 8 * j + 2 * t + (e & 1);
          const int key_pos = kpos[col];
          if (n0 + col >= n_end || key_pos < 0 || !p.mask(e < 2 ? pos_a : pos_b, key_pos)) x = kNegInf;
        }
        s[j][e] = x;
        row_max[e >> 1] = fmaxf(row_max[e >> 1], x);
      }
    }
    float shift[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      alpha[r] = softmax_rescale(st[r], row_max[r], &shift[r]);
    }
#pragma unroll
    for (int dn = 0; dn < Shape::kOutBlocks; ++dn) {
      o[dn][0] *= alpha[0];
      o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1];
      o[dn][3] *= alpha[1];
    }
#pragma unroll
    for (int j = 0; j < Shape::kKeyBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = __expf(s[j][e] - shift[e >> 1]);  // exp(-inf) = 0 for masked keys
        st[e >> 1].l += s[j][e];
      }
    }

    // O += P V: P's C tiles (2 key blocks) are the A fragment; V columns packed from 2 rows.
#pragma unroll
    for (int kk = 0; kk < Shape::kPvSteps; ++kk) {
      const uint32_t a[4] = {pack_floats<T>(s[2 * kk][0], s[2 * kk][1]),
                             pack_floats<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack_floats<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_floats<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      // Tiles of V rows 16kk + {0..7, 8..15} x features 8dn.. and 8(dn + 1)..: the B fragments
      // (b0, b1) of output blocks dn and dn + 1. Lane L addresses tile L / 8, row L % 8.
      const int tile = lane / 8;
      const T* v_row = vs + (16 * kk + (tile & 1) * 8 + (lane & 7)) * Shape::kStride + 8 * (tile >> 1);
#pragma unroll
      for (int dn = 0; dn < Shape::kOutBlocks; dn += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, v_row + 8 * dn);
        mma_16816<T>(o[dn], a, bv[0], bv[1]);
        mma_16816<T>(o[dn + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // this stage is refilled next
  }
  cp_async_wait<0>();

  // Denominators over the quad, then O / l and the LSE.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 1);
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 2);
    const int row = r0 + (r == 0 ? row_a : row_b);
    if (row >= n_rows) continue;
    const size_t out_row = size_t(row_begin + row) * p.num_qo_heads + head;
    const float inv = st[r].l > 0.f ? 1.f / st[r].l : 0.f;
#pragma unroll
    for (int dn = 0; dn < Shape::kOutBlocks; ++dn) {
      float2 v = make_float2(o[dn][2 * r] * inv, o[dn][2 * r + 1] * inv);
      *reinterpret_cast<float2*>(p.out + out_row * kHeadDim + 8 * dn + 2 * t) = v;
    }
    if (t == 0 && p.lse != nullptr) p.lse[out_row] = softmax_lse(st[r]);
  }
}

template <class T, int kHeadDim>
void launch_prefill(const PrefillParams<T>& p, cudaStream_t stream) {
  using Shape = PrefillShape<T, kHeadDim>;
  allow_dynamic_smem_once_for<prefill_kernel<T, kHeadDim>>(Shape::kSmemBytes);
  const dim3 grid((p.max_rows + kRows - 1) / kRows, p.num_qo_heads, p.batch);
  prefill_kernel<T, kHeadDim><<<grid, kThreads, Shape::kSmemBytes, stream>>>(p);
  KVLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class T>
void prefill_attention(const PrefillParams<T>& p, cudaStream_t stream) {
  const int hkv = p.kv.num_kv_heads;
  if (hkv <= 0 || p.num_qo_heads < hkv || p.num_qo_heads % hkv != 0)
    fail("prefill_attention: ", p.num_qo_heads, " query heads over ", hkv, " KV heads");
  if (p.kv.page_size <= 0) fail("prefill_attention: page_size must be positive");
  if (p.key_rope_pos != nullptr &&
      (p.rope.half * 2 != p.kv.head_dim || p.rope.cos_sin == nullptr || p.rope.n_positions <= 0))
    fail("prefill_attention: rope at read needs a RopeTableView for head_dim ", p.kv.head_dim);
  if (p.batch == 0 || p.max_rows == 0) return;
  switch (p.kv.head_dim) {
    case 64: launch_prefill<T, 64>(p, stream); break;
    case 128: launch_prefill<T, 128>(p, stream); break;
    default: fail("prefill_attention: head_dim ", p.kv.head_dim, " unsupported (64 or 128)");
  }
}

template void prefill_attention<__half>(const PrefillParams<__half>&, cudaStream_t);
template void prefill_attention<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kvlab::cuda
