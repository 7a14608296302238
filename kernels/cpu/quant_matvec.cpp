// Compiled with -ffp-contract=off (see quant_matvec.h: the float order is part of the contract).
#include "kernels/cpu/quant_matvec.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/enum_names.h"
#include "kernels/common/error.h"
#include "kernels/cpu/cpu_path.h"

namespace kvlab {

const char* quant_isa_name(QuantIsa isa) {
  static constexpr EnumName<QuantIsa> kNames[] = {
      {QuantIsa::kScalar, "scalar"}, {QuantIsa::kAvx2, "avx2"}, {QuantIsa::kAvx512Vnni, "avx512vnni"}};
  return enum_name(kNames, isa);
}

namespace {
bool detect_quant_isa(QuantIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case QuantIsa::kScalar: return true;
    case QuantIsa::kAvx2: return cpu_has_avx2_fma_f16c();  // (cpu_path.h: F16C read from CPUID)
    case QuantIsa::kAvx512Vnni:
      return detect_quant_isa(QuantIsa::kAvx2) && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}
}  // namespace

// Detected once (each matvec call checks its ISA: cpuid queries there cost 1.5% of q8_0 decode).
bool quant_isa_supported(QuantIsa isa) {
  static const bool supported[3] = {detect_quant_isa(QuantIsa::kScalar), detect_quant_isa(QuantIsa::kAvx2),
                                    detect_quant_isa(QuantIsa::kAvx512Vnni)};
  const auto i = static_cast<size_t>(isa);
  return i < 3 && supported[i];
}

QuantIsa quant_isa_best() {
  static const QuantIsa best = quant_isa_supported(QuantIsa::kAvx512Vnni) ? QuantIsa::kAvx512Vnni
                               : quant_isa_supported(QuantIsa::kAvx2)     ? QuantIsa::kAvx2
                                                                          : QuantIsa::kScalar;
  return best;
}

bool quant_matvec_supports(DType t) { return is_block_quant(t) || t == DType::kQ8_0; }

void quantize_activations(const float* x, int64_t n, int64_t cols, int64_t block, QuantActivations& out) {
  if (block <= 0 || block % 16 != 0 || cols % block != 0)
    fail("quantize_activations: ", cols, " columns are not a multiple of the block ", block);
  out.block = block, out.cols = cols, out.n = n;
  const int64_t nb = cols / block;
  out.d.resize(static_cast<size_t>(n * nb));
  out.q.resize(static_cast<size_t>(n * cols));
  out.s16.resize(static_cast<size_t>(n * cols / 16));
  out.s32.resize(static_cast<size_t>(n * cols / 32));
  out.s4.resize(static_cast<size_t>(n * cols / 4));
  out.s2.resize(static_cast<size_t>(n * cols / 2));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * cols + b * block;
      int8_t* qb = out.q.data() + t * cols + b * block;
      float amax = 0;
      bool finite = true;
      for (int64_t i = 0; i < block; ++i) {
        finite = finite && std::isfinite(xb[i]);
        amax = std::max(amax, std::fabs(xb[i]));
      }
      float d = amax / 127;
      if (!finite) {
        d = std::numeric_limits<float>::quiet_NaN();
        std::fill(qb, qb + block, int8_t{0});
      } else {
        const float id = d != 0 ? 1 / d : 0.f;
        for (int64_t i = 0; i < block; ++i) qb[i] = static_cast<int8_t>(std::round(xb[i] * id));
      }
      out.d[t * nb + b] = d;
      for (int64_t g = 0; g < block / 16; ++g) {
        int32_t s = 0;
        for (int i = 0; i < 16; ++i) s += qb[16 * g + i];
        out.s16[(t * cols + b * block) / 16 + g] = s;
      }
    }
  for (size_t i = 0; i < out.s2.size(); ++i) out.s2[i] = static_cast<int16_t>(out.q[2 * i] + out.q[2 * i + 1]);
  for (size_t i = 0; i < out.s4.size(); ++i)
    out.s4[i] = out.q[4 * i] + out.q[4 * i + 1] + out.q[4 * i + 2] + out.q[4 * i + 3];
  for (size_t i = 0; i < out.s32.size(); ++i)
    out.s32[i] = static_cast<int16_t>(out.s16[2 * i] + out.s16[2 * i + 1]);
}

namespace {

void check(const WeightView& w, const QuantActivations& a) {
  if (!quant_matvec_supports(w.dtype)) fail("quant_matvec_rows: ", dtype_name(w.dtype), " is not a block-quantised type");
  if (a.block != quant_block_values(w.dtype) || a.cols != w.cols)
    fail("quant_matvec_rows: activations quantised in blocks of ", a.block, " over ", a.cols, " columns for a ",
         dtype_name(w.dtype), " matrix of ", w.cols, " columns");
}

void quant_matvec_rows_scalar(const WeightView& w, const QuantActivations& a, float* y, int64_t r0, int64_t r1) {
  const int64_t bv = a.block, nb = w.cols / bv, groups = bv / 16;
  const size_t bb = quant_block_bytes(w.dtype);
  UnpackedBlock u;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t t = 0; t < a.n; ++t) {
      float acc[kQuantLanes] = {}, acc_min = 0;
      for (int64_t b = 0; b < nb; ++b) {
        unpack_block(w.dtype, row + b * bb, u);
        const int8_t* q8 = a.q.data() + t * w.cols + b * bv;
        const int32_t* s16 = a.s16.data() + (t * w.cols + b * bv) / 16;
        int32_t lane[kQuantLanes] = {}, s2 = 0;
        for (int64_t i = 0; i < bv; ++i)  // value i: lane (i mod 32) / 4, group i / 16
          lane[(i % 32) / 4] += u.sc[i / 16] * (static_cast<int32_t>(u.q[i]) * q8[i]);
        for (int64_t g = 0; g < groups; ++g) s2 += u.m[g] * s16[g];
        const float da = a.d[t * nb + b];
        const float dd = u.d * da, dm = u.dmin * da;
        for (int k = 0; k < kQuantLanes; ++k) acc[k] = std::fma(dd, static_cast<float>(lane[k]), acc[k]);
        acc_min = std::fma(dm, static_cast<float>(s2), acc_min);  // stays +0 for types without a min
      }
      y[t * w.rows + r] = quant_lane_tree(acc) - acc_min;
    }
  }
}

}  // namespace

void quant_matvec_rows(const WeightView& w, const QuantActivations& a, float* y, int64_t row_begin,
                       int64_t row_end, QuantIsa isa) {
  check(w, a);
  if (!quant_isa_supported(isa)) fail("quant_matvec_rows: this CPU has no ", quant_isa_name(isa));
  switch (isa) {
    case QuantIsa::kScalar: quant_matvec_rows_scalar(w, a, y, row_begin, row_end); return;
    case QuantIsa::kAvx2: detail::quant_matvec_rows_avx2(w, a, y, row_begin, row_end); return;
    case QuantIsa::kAvx512Vnni: detail::quant_matvec_rows_vnni(w, a, y, row_begin, row_end); return;
  }
}

void quant_matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                       int64_t row_end, QuantIsa isa) {
  if (!quant_matvec_supports(w.dtype)) fail("quant_matvec_rows: ", dtype_name(w.dtype), " is not a block-quantised type");
  thread_local QuantActivations a;
  quantize_activations(x, n, w.cols, quant_block_values(w.dtype), a);
  quant_matvec_rows(w, a, y, row_begin, row_end, isa);
}

}  // namespace kvlab
