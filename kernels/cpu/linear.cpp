#include "kernels/cpu/linear.h"

#include <cblas.h>
#include <immintrin.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/common/enum_names.h"
#include "kernels/common/error.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/cpu_path.h"
#include "kernels/cpu/simd_target.h"
#include "kernels/cpu/quant_matvec.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename();

namespace kvlab {

namespace {
constexpr int kQ8BlockSize = static_cast<int>(kQ8_0BlockSize);
constexpr int kQ8BlockBytes = static_cast<int>(sizeof(BlockQ8_0));
}  // namespace

// ---- reference ------------------------------------------------------------------------------

namespace {

float weight_at(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = w.row(r);
  switch (w.dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(row)[c];
    case DType::kF16: return fp16_to_fp32(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::kBF16: return bf16_to_fp32(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::kQ8_0: {
      const uint8_t* blk = row + (c / kQ8BlockSize) * kQ8BlockBytes;
      uint16_t d;
      std::memcpy(&d, blk, 2);
      return fp16_to_fp32(d) * static_cast<float>(static_cast<int8_t>(blk[2 + c % kQ8BlockSize]));
    }
    default: {  // block-quantised types (quant_blocks.h): dequantise the block holding c
      const int64_t bv = quant_block_values(w.dtype);
      float block[256];
      dequantize_blocks(w.dtype, row + (c / bv) * quant_block_bytes(w.dtype), block, bv);
      return block[c % bv];
    }
  }
}

}  // namespace

void dequantize_rows(const WeightView& w, int64_t row_begin, int64_t row_end, float* out) {
  for (int64_t r = row_begin; r < row_end; ++r) to_float(w.dtype, w.row(r), out + (r - row_begin) * w.cols, w.cols);
}

void linear_reference(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                      int64_t row_end) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = row_begin; r < row_end; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c)
        acc += static_cast<double>(weight_at(w, r, c)) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
}

// ---- fast kernels --------------------------------------------------------------------------
// The matvec kernels below are compiled for AVX2+FMA+F16C by target attributes (the pragmas), so
// a KVLAB_NATIVE=OFF build stays baseline x86-64 elsewhere; matvec_rows runs them only where
// cpu_path() is kAvx2, else the portable loop after them.
KVLAB_TARGET_BEGIN("avx2,fma,f16c")

namespace {

// Loads 8 consecutive weights of a row starting at column c as fp32 (and one, for tails).
struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  static __m256 load8(const uint8_t* row, int64_t c) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
  static float load1(const uint8_t* row, int64_t c) { return reinterpret_cast<const float*>(row)[c]; }
};
struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  static __m256 load8(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
  static float load1(const uint8_t* row, int64_t c) {
    return fp16_to_fp32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};
struct LoadBF16 {  // bf16 -> fp32: zero-extend to 32 bits, shift into the high half
  static constexpr int64_t kBytes = 2;
  static __m256 load8(const uint8_t* row, int64_t c) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float load1(const uint8_t* row, int64_t c) {
    return bf16_to_fp32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[i] = row_i . x for R rows, two 8-wide accumulators per row (2R independent FMA chains).
template <class L, int R>
inline void dot_rows(const uint8_t* const* rows, const float* x, int64_t cols, float* out) {
  __m256 a[R], b[R];
  for (int i = 0; i < R; ++i) a[i] = b[i] = _mm256_setzero_ps();
  int64_t c = 0;
  // Software prefetch a few cache lines ahead in every row: R concurrent row streams defeat
  // the hardware prefetcher often enough that 16-bit rows stay latency-bound without it.
  constexpr int64_t kAhead = 512 / L::kBytes;  // columns ahead (512 bytes)
  for (; c + 16 <= cols; c += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + c);
    const __m256 x1 = _mm256_loadu_ps(x + c + 8);
    if (c % (64 / L::kBytes) < 16)
      for (int i = 0; i < R; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(rows[i] + (c + kAhead) * L::kBytes), _MM_HINT_T0);
    for (int i = 0; i < R; ++i) {
      a[i] = _mm256_fmadd_ps(L::load8(rows[i], c), x0, a[i]);
      b[i] = _mm256_fmadd_ps(L::load8(rows[i], c + 8), x1, b[i]);
    }
  }
  if (c + 8 <= cols) {
    const __m256 x0 = _mm256_loadu_ps(x + c);
    for (int i = 0; i < R; ++i) a[i] = _mm256_fmadd_ps(L::load8(rows[i], c), x0, a[i]);
    c += 8;
  }
  for (int i = 0; i < R; ++i) {
    float s = hsum(_mm256_add_ps(a[i], b[i]));
    for (int64_t k = c; k < cols; ++k) s += L::load1(rows[i], k) * x[k];
    out[i] = s;
  }
}

template <int R>
inline void dot_rows_any(DType type, const uint8_t* const* rows, const float* x, int64_t cols,
                         float* out) {
  switch (type) {
    case DType::kF32: dot_rows<LoadF32, R>(rows, x, cols, out); break;
    case DType::kF16: dot_rows<LoadF16, R>(rows, x, cols, out); break;
    case DType::kBF16: dot_rows<LoadBF16, R>(rows, x, cols, out); break;
    default: KVLAB_CHECK(false, "q8_0 and the block-quantised types run in quant_matvec");
  }
}

void matvec_rows_avx2(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                      int64_t row_end) {
  constexpr int kR = 4;
  int64_t r = row_begin;
  for (; r + kR <= row_end; r += kR) {
    const uint8_t* rows[kR] = {w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)};
    for (int64_t t = 0; t < n; ++t) {
      float out[kR];
      dot_rows_any<kR>(w.dtype, rows, x + t * w.cols, w.cols, out);
      std::memcpy(y + t * w.rows + r, out, sizeof(out));
    }
  }
  for (; r < row_end; ++r) {
    const uint8_t* rows[1] = {w.row(r)};
    for (int64_t t = 0; t < n; ++t) dot_rows_any<1>(w.dtype, rows, x + t * w.cols, w.cols, y + t * w.rows + r);
  }
}

}  // namespace

KVLAB_TARGET_END


// ---- AVX-512 matvec ------------------------------------------------------------------------
// The same kernels 16 lanes wide (AVX-512 F/BW/VL: Skylake-X and later Xeons, Zen 4), chosen at
// run time by matvec_isa(). Weights are still widened to fp32 in registers and multiplied with
// fp32 activations, so the results differ from the AVX2 path only by the order of the fp32 sums.
KVLAB_TARGET_AVX512_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace {

struct Load16F32 {
  static constexpr int64_t kBytes = 4;
  static __m512 load16(const uint8_t* row, int64_t c) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
  static float load1(const uint8_t* row, int64_t c) { return reinterpret_cast<const float*>(row)[c]; }
};
struct Load16BF16 {  // zero-extend to 32 bits, shift into the high half
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* row, int64_t c) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static float load1(const uint8_t* row, int64_t c) {
    return bf16_to_fp32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

// out[i] = row_i . x for R rows, two 16-wide accumulators per row.
template <class L, int R>
inline void dot_rows16(const uint8_t* const* rows, const float* x, int64_t cols, float* out) {
  __m512 a[R], b[R];
  for (int i = 0; i < R; ++i) a[i] = b[i] = _mm512_setzero_ps();
  int64_t c = 0;
  constexpr int64_t kAhead = 1024 / L::kBytes;        // columns ahead (1 KiB) for the prefetch
  constexpr int64_t kStepBytes = 32 * L::kBytes;      // row bytes per iteration (1 or 2 lines)
  for (; c + 32 <= cols; c += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + c);
    const __m512 x1 = _mm512_loadu_ps(x + c + 16);
    for (int i = 0; i < R; ++i)
      for (int64_t off = 0; off < kStepBytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rows[i] + (c + kAhead) * L::kBytes + off), _MM_HINT_T0);
    for (int i = 0; i < R; ++i) {
      a[i] = _mm512_fmadd_ps(L::load16(rows[i], c), x0, a[i]);
      b[i] = _mm512_fmadd_ps(L::load16(rows[i], c + 16), x1, b[i]);
    }
  }
  if (c + 16 <= cols) {
    const __m512 x0 = _mm512_loadu_ps(x + c);
    for (int i = 0; i < R; ++i) a[i] = _mm512_fmadd_ps(L::load16(rows[i], c), x0, a[i]);
    c += 16;
  }
  for (int i = 0; i < R; ++i) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a[i], b[i]));
    for (int64_t k = c; k < cols; ++k) s += L::load1(rows[i], k) * x[k];
    out[i] = s;
  }
}

template <int R>
inline void dot_rows16_any(DType type, const uint8_t* const* rows, const float* x, int64_t cols,
                           float* out) {
  switch (type) {
    case DType::kF32: dot_rows16<Load16F32, R>(rows, x, cols, out); break;
    case DType::kF16: break;  // never called: matvec_rows_avx512 runs fp16 on the AVX2 kernel
    case DType::kBF16: dot_rows16<Load16BF16, R>(rows, x, cols, out); break;
    default: break;  // never called: q8_0 and the block types take the integer kernels (matvec_rows)
  }
}

void matvec_rows_avx512(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                        int64_t row_end) {
  if (w.dtype == DType::kF16) {
    // fp16 stays on the 8-lane kernel: on the AVX-512 Xeon measured (kvlab_bench_linear, one
    // thread) the 16-lane vcvtph2ps loop streamed 0.81-0.94x of the AVX2 one.
    matvec_rows_avx2(w, x, n, y, row_begin, row_end);
    return;
  }
  constexpr int kR = 4;
  int64_t r = row_begin;
  for (; r + kR <= row_end; r += kR) {
    const uint8_t* rows[kR] = {w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)};
    for (int64_t t = 0; t < n; ++t) {
      float out[kR];
      dot_rows16_any<kR>(w.dtype, rows, x + t * w.cols, w.cols, out);
      std::memcpy(y + t * w.rows + r, out, sizeof(out));
    }
  }
  for (; r < row_end; ++r) {
    const uint8_t* rows[1] = {w.row(r)};
    for (int64_t t = 0; t < n; ++t) dot_rows16_any<1>(w.dtype, rows, x + t * w.cols, w.cols, y + t * w.rows + r);
  }
}

}  // namespace

KVLAB_TARGET_AVX512_END

namespace {

// Portable matvec: one row at a time, fp32 accumulation.
// (Nothing from the target region above is called here: those functions carry the AVX2 target.)
float dot_row_portable(DType type, const uint8_t* row, const float* x, int64_t cols) {
  const auto* f32 = reinterpret_cast<const float*>(row);
  const auto* u16 = reinterpret_cast<const uint16_t*>(row);
  float s = 0.f;
  switch (type) {
    case DType::kF32: for (int64_t c = 0; c < cols; ++c) s += f32[c] * x[c]; break;
    case DType::kF16: for (int64_t c = 0; c < cols; ++c) s += fp16_to_fp32(u16[c]) * x[c]; break;
    case DType::kBF16: for (int64_t c = 0; c < cols; ++c) s += bf16_to_fp32(u16[c]) * x[c]; break;
    default: KVLAB_CHECK(false, "q8_0 and the block-quantised types run in quant_matvec");
  }
  return s;
}

void check_matrix(const WeightView& w) {
  if (w.dtype == DType::kQ8_0 && w.cols % kQ8BlockSize != 0)
    fail("q8_0 weight with ", w.cols, " columns: q8_0 needs a multiple of 32");
  if (is_block_quant(w.dtype) && w.cols % quant_block_values(w.dtype) != 0)
    fail(dtype_name(w.dtype), " weight with ", w.cols, " columns: needs a multiple of ", quant_block_values(w.dtype));
}

}  // namespace

namespace {
// The integer kernels' instruction set beside a matvec one: the scalar reference on the portable
// path, else the best this CPU has.
QuantIsa quant_isa_for(MatvecIsa isa) { return isa == MatvecIsa::kPortable ? QuantIsa::kScalar : quant_isa_best(); }
}  // namespace

const char* to_string(MatvecIsa isa) {
  static constexpr EnumName<MatvecIsa> kNames[] = {
      {MatvecIsa::kPortable, "portable"}, {MatvecIsa::kAvx2, "avx2"}, {MatvecIsa::kAvx512, "avx512"}};
  return enum_name(kNames, isa);
}

bool matvec_isa_supported(MatvecIsa isa) {
  switch (isa) {
    case MatvecIsa::kPortable: return true;
    case MatvecIsa::kAvx2: return cpu_has_avx2_fma_f16c();
    case MatvecIsa::kAvx512:
      // __builtin_cpu_supports also checks that the OS saves the ZMM state (XCR0)
      return cpu_has_avx2_fma_f16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

MatvecIsa matvec_isa() {
  static const MatvecIsa isa = [] {
    if (cpu_path() == CpuPath::kPortable) return MatvecIsa::kPortable;  // KVLAB_CPU_PATH=portable
    return matvec_isa_supported(MatvecIsa::kAvx512) ? MatvecIsa::kAvx512 : MatvecIsa::kAvx2;
  }();
  return isa;
}

void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end, MatvecIsa isa) {
  if (!matvec_isa_supported(isa)) fail("matvec_rows: this CPU cannot run the ", to_string(isa), " kernels");
  if (quant_matvec_supports(w.dtype)) {  // integer kernels on int8 activations (quant_matvec.h)
    quant_matvec_rows(w, x, n, y, row_begin, row_end, quant_isa_for(isa));
    return;
  }
  switch (isa) {
    case MatvecIsa::kAvx512: matvec_rows_avx512(w, x, n, y, row_begin, row_end); return;
    case MatvecIsa::kAvx2: matvec_rows_avx2(w, x, n, y, row_begin, row_end); return;
    case MatvecIsa::kPortable: break;
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = row_begin; r < row_end; ++r)
      y[t * w.rows + r] = dot_row_portable(w.dtype, w.row(r), x + t * w.cols, w.cols);
}

void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end, CpuPath path) {
  matvec_rows(w, x, n, y, row_begin, row_end, path == CpuPath::kAvx2 ? MatvecIsa::kAvx2 : MatvecIsa::kPortable);
}

void matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                 int64_t row_end) {
  matvec_rows(w, x, n, y, row_begin, row_end, matvec_isa());
}

// ---- OpenBLAS's kernels ----------------------------------------------------------------------
// OpenBLAS as Debian ships it (libopenblas0-pthread, a DYNAMIC_ARCH build) picks its kernels when
// it is loaded, from the CPU's model number; a model it does not know gets its SSE3 "Prescott"
// kernels. 0.3.21 does not know the Intel Xeon of family 6 model 207 (0xCF; AVX-512 with BF16
// and AMX): there the prefill sgemm ran the Prescott kernel, ~3x slower than SkylakeX's
// (kvlab generate, 512-token prompt, 1 thread: 51-53 tok/s against 146-166 with
// OPENBLAS_CORETYPE=SkylakeX). So before kvlab's first BLAS call, if OpenBLAS fell back to
// Prescott on a CPU with AVX-512 F/BW/VL/DQ (or AVX2 + FMA) and the user did not choose a core,
// kvlab re-runs OpenBLAS's own core selection with OPENBLAS_CORETYPE=SkylakeX (Haswell), the
// documented override, through the two functions DYNAMIC_ARCH builds export for it. A BLAS
// without them (weak symbols: null) keeps its kernels, and so does every CPU OpenBLAS knows
// (Zen 3, Zen 4, Skylake-X ...): there nothing changes. (Setting the variable before OpenBLAS
// loads does not work from inside the program: libc's start-up resets the environment after
// .preinit_array runs and before the libraries' initialisers.)
extern "C" void gotoblas_dynamic_init() __attribute__((weak));
extern "C" void gotoblas_dynamic_quit() __attribute__((weak));

namespace {
// Called once, before the first BLAS call (no BLAS call is running then).
bool fix_openblas_fallback_core() {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return false;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;
  const char* core = openblas_get_corename();
  if (core == nullptr || strcasecmp(core, "prescott") != 0) return false;
  const char* want = matvec_isa_supported(MatvecIsa::kAvx512) ? "SkylakeX"
                     : cpu_has_avx2_fma_f16c()                 ? "Haswell"
                                                               : nullptr;
  if (want == nullptr) return false;
  setenv("OPENBLAS_CORETYPE", want, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");  // (the environment as the user left it)
  return true;
}
void ensure_openblas_core() {
  static const bool fixed = fix_openblas_fallback_core();
  (void)fixed;
}
}  // namespace

const char* blas_core_name() {
  ensure_openblas_core();
  return openblas_get_corename();
}

// OpenBLAS's pthreads build stops its worker threads with this (exported, not in cblas.h; it
// is what OpenBLAS itself calls around fork). A later call on more threads starts them again.
// Weak: a BLAS without it keeps its threads.
extern "C" int blas_thread_shutdown_() __attribute__((weak));

namespace {
std::atomic<int> g_blas_threads{-1};
// Sets OpenBLAS's thread count when it differs (call outside parallel regions). On 1 thread its
// worker threads are stopped: OpenBLAS starts them when it loads, and each polls for work
// (sched_yield) for 2^28 cycles after it starts and after every job before it sleeps, ~0.1 s of
// a core; with `--threads 1` that CPU time counted against the first RULER sample
// (evals_peer_kept_positions_test: 0.093 s of process CPU in 0.057 s of wall time).
void set_blas_threads(int n) {
  ensure_openblas_core();
  if (g_blas_threads.load() != n) {
    openblas_set_num_threads(n);
    if (n == 1 && blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
    g_blas_threads.store(n);
  }
}
}  // namespace

void use_single_threaded_blas() { set_blas_threads(1); }

void sgemm_xwt(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y,
               int64_t ldy, int blas_threads) {
  set_blas_threads(blas_threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
              static_cast<int>(cols), 1.f, x, static_cast<int>(cols), w, static_cast<int>(cols), 0.f,
              y, static_cast<int>(ldy));
}

namespace {

// y[:, r0:r1] of one job for all n tokens: matvec or sgemm on this thread (the integer matvec
// on x already quantised into `scratch`).
void linear_slice(const LinearJob& j, const float* x, int64_t n, int64_t r0, int64_t r1,
                  const LinearScratch& scratch, std::vector<float>& panel) {
  if (n < kGemmMinTokens && quant_matvec_supports(j.w.dtype)) {
    const QuantActivations& a = quant_block_values(j.w.dtype) == 32 ? scratch.x_q32 : scratch.x_q256;
    quant_matvec_rows(j.w, a, j.y, r0, r1, quant_isa_for(matvec_isa()));
  } else if (n < kGemmMinTokens) {
    matvec_rows(j.w, x, n, j.y, r0, r1);
  } else if (j.w.dtype == DType::kF32) {
    sgemm_xwt(x, n, reinterpret_cast<const float*>(j.w.row(r0)), r1 - r0, j.w.cols, j.y + r0,
              j.w.rows, 1);
  } else {
    // ~2 MiB panels, dequantized once and used by all n tokens: each sgemm call packs its
    // operands again, so a panel wants many rows (perf of a bf16 prefill of 512 tokens, 1
    // thread: OpenBLAS's sgemm_oncopy took 8.6% of the time with 256 KiB panels, 2.8% with these)
    const int64_t panel_rows = std::max<int64_t>(16, (int64_t{1} << 19) / std::max<int64_t>(1, j.w.cols));
    panel.resize(static_cast<size_t>(panel_rows * j.w.cols));
    for (int64_t p0 = r0; p0 < r1; p0 += panel_rows) {
      const int64_t p1 = std::min(r1, p0 + panel_rows);
      dequantize_rows(j.w, p0, p1, panel.data());
      sgemm_xwt(x, n, panel.data(), p1 - p0, j.w.cols, j.y + p0, j.w.rows, 1);
    }
  }
  if (j.bias)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = r0; r < r1; ++r) j.y[t * j.w.rows + r] += j.bias[r];
}

}  // namespace

void linear(ThreadPool& pool, const float* x, int64_t n, std::initializer_list<LinearJob> jobs,
            LinearScratch& scratch) {
  for (const LinearJob& j : jobs) check_matrix(j.w);
  // Rows of every job, in units of 4 rows (16 for gemm: whole SIMD tiles per thread), split
  // evenly across threads in one pass.
  const int64_t unit = n < kGemmMinTokens ? 4 : 16;
  int64_t unit_begin[8];
  const size_t n_jobs = jobs.size();
  KVLAB_CHECK(n_jobs < 8, "at most 7 fused linear jobs");
  unit_begin[0] = 0;
  for (size_t k = 0; k < n_jobs; ++k)
    unit_begin[k + 1] = unit_begin[k] + (jobs.begin()[k].w.rows + unit - 1) / unit;
  if (static_cast<int>(scratch.panels.size()) < pool.size()) scratch.panels.resize(pool.size());
  const LinearJob* job_list = jobs.begin();
  // Small work (tiny models) runs on the calling thread: a fork-join costs more than it saves,
  // and far more when the cores are shared with other processes.
  size_t work_bytes = 0;
  for (const LinearJob& j : jobs) work_bytes += j.w.row_bytes() * static_cast<size_t>(j.w.rows);
  work_bytes *= static_cast<size_t>(std::max<int64_t>(1, n));
  auto body = [&](int64_t u0, int64_t u1, int thread) {
    for (size_t k = 0; k < n_jobs; ++k) {
      const int64_t lo = std::max(u0, unit_begin[k]), hi = std::min(u1, unit_begin[k + 1]);
      if (lo >= hi) continue;
      const LinearJob& j = job_list[k];
      const int64_t r0 = (lo - unit_begin[k]) * unit;
      const int64_t r1 = std::min(j.w.rows, (hi - unit_begin[k]) * unit);
      linear_slice(j, x, n, r0, r1, scratch, scratch.panels[thread]);
    }
  };
  if (n >= kGemmMinTokens) set_blas_threads(1);  // before the region: BLAS runs inside it, 1 thread each
  if (n < kGemmMinTokens) {  // x quantised once per block size for the integer matvec jobs
    bool done32 = false, done256 = false;
    for (const LinearJob& j : jobs) {
      if (!quant_matvec_supports(j.w.dtype)) continue;
      const int64_t bv = quant_block_values(j.w.dtype);
      bool& done = bv == 32 ? done32 : done256;
      if (!done) quantize_activations(x, n, j.w.cols, bv, bv == 32 ? scratch.x_q32 : scratch.x_q256);
      done = true;
    }
  }
  if (work_bytes < kMinParallelBytes) body(0, unit_begin[n_jobs], 0);
  else pool.parallel_for(unit_begin[n_jobs], body);
}

}  // namespace kvlab
