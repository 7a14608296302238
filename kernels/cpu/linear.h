// Dense layers y = W x for weights kept in their stored dtype (fp32, fp16, bf16, q8_0 and the
// GGUF block types: kernels/cpu/dtype.h, quant_blocks.h), fp32 activations in and out.
// The forward pass spends nearly all its time here.
//
//   W: row-major [rows, cols] (rows = output features), element type by WeightType
//   x: [n, cols] fp32 (n tokens),  y: [n, rows] fp32
//   y[t, r] = sum_c W[r, c] * x[t, c]                       (W[d,n] @ x[n] -> y[d], per token)
//
// Two paths, validated against plain loops (linear_test.cpp):
// - matvec (decode, small n): fp32 / fp16 / bf16 on AVX-512 or AVX2+FMA+F16C (chosen at run
//   time: matvec_isa(); else a portable loop), 4 rows at a time sharing each x load, weights
//   converted to fp32 in registers (fp16: vcvtph2ps; bf16: shift into the high half), fp32
//   accumulation. Memory-bound, so it streams each weight byte once per call and needs many
//   independent accumulators to keep up with DRAM. q8_0 and the block types instead quantise x
//   to int8 once per call and take integer dot products (quant_matvec.h, with its error bound).
// - gemm (prefill, n >= kGemmMinTokens): OpenBLAS sgemm, one single-threaded call per pool
//   thread on its own slice of the output features (so OpenBLAS never starts threads of its
//   own next to the pool's).
//   Non-fp32 weights are dequantized one panel of rows at a time into a per-thread fp32 buffer
//   that stays in cache.
// Row ranges let a thread pool split one matrix (or several sharing x) across threads.
//
// Q8_0 is GGML's layout (BlockQ8_0): each row is cols/32 blocks of { fp16 scale d; int8 q[32] },
// value = d * q. cols must be a multiple of 32 for q8_0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/cpu/cpu_path.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/quant_matvec.h"

namespace kvlab {

class ThreadPool;

// Decode batches up to this size use the matvec kernel; larger ones use sgemm.
inline constexpr int kGemmMinTokens = 8;
// Calls touching fewer weight bytes (x tokens) than this run on the calling thread alone.
inline constexpr size_t kMinParallelBytes = size_t{128} << 10;

// Writes rows [row_begin, row_end) of W as fp32 into out[(row_end-row_begin), cols].
void dequantize_rows(const WeightView& w, int64_t row_begin, int64_t row_end, float* out);

// Plain-loop reference: y[t, r] for r in [row_begin, row_end), every token t < n.
void linear_reference(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                      int64_t row_end);

// The matvec kernels' instruction sets. kAvx2: AVX2+FMA+F16C, 8 lanes; kAvx512: AVX-512
// F/BW/VL/DQ, 16 lanes (Intel Xeon since Skylake-X, AMD Zen 4; fp16 weights stay on the 8-lane
// kernel, measured faster there); kPortable: plain loops. All widen
// the weights to fp32 and accumulate in fp32 (they differ only in the order of the sums).
enum class MatvecIsa { kPortable, kAvx2, kAvx512 };
const char* to_string(MatvecIsa isa);          // "portable" | "avx2" | "avx512"
bool matvec_isa_supported(MatvecIsa isa);      // this CPU and OS can run it
// Detected once per process: the widest supported; kPortable when KVLAB_CPU_PATH=portable.
MatvecIsa matvec_isa();

// The fast per-token kernel over a row range (one thread's share), on matvec_isa().
void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end);
// The same on a chosen path: kAvx2 (the SIMD kernel; an error on a CPU without AVX2+FMA+F16C)
// or kPortable (one row at a time, fp32 accumulation in column order).
void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end, CpuPath path);
// The same on a chosen instruction set (kvlab::Error where !matvec_isa_supported(isa)).
void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end, MatvecIsa isa);

// One output of a fused multi-matrix call: y[n, w.rows] (+ bias[w.rows] when non-null).
struct LinearJob {
  WeightView w;
  float* y = nullptr;
  const float* bias = nullptr;
};

// Per-thread buffers for dequantized weight panels (gemm path), and x quantised to int8 once per
// call for the integer matvec (in blocks of 32 and of 256 values), reused across calls.
struct LinearScratch {
  std::vector<std::vector<float>> panels;  // [thread][panel_rows * cols]
  QuantActivations x_q32, x_q256;
};

// Runs every job on the same input x[n, cols] with the pool, in one parallel pass: the rows of
// all jobs are split evenly across threads; matvec for n < kGemmMinTokens, else sgemm. For the
// integer matvec x is quantised once, before the pass (the same values as matvec_rows's).
void linear(ThreadPool& pool, const float* x, int64_t n, std::initializer_list<LinearJob> jobs,
            LinearScratch& scratch);

// The kernel set OpenBLAS chose (openblas_get_corename(): "SkylakeX", "Haswell", "Prescott" ...);
// linear.cpp sets OPENBLAS_CORETYPE before OpenBLAS loads on AVX-512 CPUs (see there).
const char* blas_core_name();

// BLAS runs inside kvlab's own pool jobs, one thread per call: sets OpenBLAS to 1 thread and
// stops its worker threads, which would otherwise poll for work on the other cores. The engine
// calls it when it starts; linear() and sgemm_xwt(..., 1) keep it so.
void use_single_threaded_blas();

// Raw sgemm: y[n, rows] (row stride ldy) = x[n, cols] @ W^T, W fp32 row-major [rows, cols], on
// `blas_threads` OpenBLAS threads (1 inside a pool job).
void sgemm_xwt(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y,
               int64_t ldy, int blas_threads);

}  // namespace kvlab
