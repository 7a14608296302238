// Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt): the float expressions below are
// evaluated exactly as written (no fused multiply-add), which is what makes dequantisation equal
// numpy's (gguf-py) bit for bit.
#include "kernels/cpu/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/error.h"

namespace kvlab {

bool is_block_quant(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int64_t quant_block_values(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1: case DType::kQ8_0: return 32;
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: return 256;
    default: fail("quant_block_values: ", dtype_name(t), " is not a block-quantised type");
  }
}

size_t quant_block_bytes(DType t) {
  switch (t) {
    case DType::kQ4_0: return sizeof(BlockQ4_0);
    case DType::kQ4_1: return sizeof(BlockQ4_1);
    case DType::kQ5_0: return sizeof(BlockQ5_0);
    case DType::kQ5_1: return sizeof(BlockQ5_1);
    case DType::kQ8_0: return sizeof(BlockQ8_0);
    case DType::kQ2_K: return sizeof(BlockQ2_K);
    case DType::kQ3_K: return sizeof(BlockQ3_K);
    case DType::kQ4_K: return sizeof(BlockQ4_K);
    case DType::kQ5_K: return sizeof(BlockQ5_K);
    case DType::kQ6_K: return sizeof(BlockQ6_K);
    default: fail("quant_block_bytes: ", dtype_name(t), " is not a block-quantised type");
  }
}

void unpack_scales(DType t, const uint8_t* p, UnpackedBlock& out) {
  switch (t) {
    case DType::kQ4_0: unpack_scales_of<DType::kQ4_0>(p, out); return;
    case DType::kQ4_1: unpack_scales_of<DType::kQ4_1>(p, out); return;
    case DType::kQ5_0: unpack_scales_of<DType::kQ5_0>(p, out); return;
    case DType::kQ5_1: unpack_scales_of<DType::kQ5_1>(p, out); return;
    case DType::kQ8_0: unpack_scales_of<DType::kQ8_0>(p, out); return;
    case DType::kQ2_K: unpack_scales_of<DType::kQ2_K>(p, out); return;
    case DType::kQ3_K: unpack_scales_of<DType::kQ3_K>(p, out); return;
    case DType::kQ4_K: unpack_scales_of<DType::kQ4_K>(p, out); return;
    case DType::kQ5_K: unpack_scales_of<DType::kQ5_K>(p, out); return;
    case DType::kQ6_K: unpack_scales_of<DType::kQ6_K>(p, out); return;
    default: fail("unpack_scales: ", dtype_name(t), " is not a block-quantised type");
  }
}

void unpack_block(DType t, const uint8_t* p, UnpackedBlock& out) {
  unpack_scales(t, p, out);
  int8_t* q = out.q;
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: {
      const uint8_t* qs = p + (t == DType::kQ4_0 ? 2 : 4);
      const int offset = t == DType::kQ4_0 ? 8 : 0;
      for (int l = 0; l < 16; ++l) {
        q[l] = static_cast<int8_t>((qs[l] & 15) - offset);
        q[l + 16] = static_cast<int8_t>((qs[l] >> 4) - offset);
      }
      return;
    }
    case DType::kQ5_0: case DType::kQ5_1: {
      const uint8_t* qhp = p + (t == DType::kQ5_0 ? 2 : 4);
      const uint8_t* qs = qhp + 4;
      uint32_t qh;
      std::memcpy(&qh, qhp, 4);
      const int offset = t == DType::kQ5_0 ? 16 : 0;
      for (int l = 0; l < 16; ++l) {
        q[l] = static_cast<int8_t>(((qs[l] & 15) | ((qh >> l) & 1) << 4) - offset);
        q[l + 16] = static_cast<int8_t>(((qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4) - offset);
      }
      return;
    }
    case DType::kQ8_0:
      std::memcpy(q, p + 2, 32);
      return;
    case DType::kQ2_K: case DType::kQ3_K: {
      const uint8_t* qs = t == DType::kQ2_K ? reinterpret_cast<const BlockQ2_K*>(p)->qs
                                            : reinterpret_cast<const BlockQ3_K*>(p)->qs;
      for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s)
          for (int l = 0; l < 32; ++l) q[128 * h + 32 * s + l] = static_cast<int8_t>((qs[32 * h + l] >> (2 * s)) & 3);
      if (t == DType::kQ3_K) {
        const uint8_t* hmask = reinterpret_cast<const BlockQ3_K*>(p)->hmask;
        for (int k = 0; k < 8; ++k)
          for (int l = 0; l < 32; ++l)
            if (((hmask[l] >> k) & 1) == 0) q[32 * k + l] = static_cast<int8_t>(q[32 * k + l] - 4);
      }
      return;
    }
    case DType::kQ4_K: case DType::kQ5_K: {
      const bool q5 = t == DType::kQ5_K;
      const uint8_t* qh = p + 16;
      const uint8_t* qs = p + (q5 ? 48 : 16);
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
          q[64 * c + l] = static_cast<int8_t>(qs[32 * c + l] & 15);
          q[64 * c + 32 + l] = static_cast<int8_t>(qs[32 * c + l] >> 4);
        }
      if (q5)
        for (int j = 0; j < 8; ++j)
          for (int l = 0; l < 32; ++l) q[32 * j + l] = static_cast<int8_t>(q[32 * j + l] | ((qh[l] >> j) & 1) << 4);
      return;
    }
    case DType::kQ6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(p);
      for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s)
          for (int l = 0; l < 32; ++l) {
            const uint8_t lo_byte = b->ql[64 * h + l + 32 * (s & 1)];
            const int lo = s >= 2 ? lo_byte >> 4 : lo_byte & 15;
            const int hi = (b->qh[32 * h + l] >> (2 * s)) & 3;
            q[128 * h + 32 * s + l] = static_cast<int8_t>((lo | hi << 4) - 32);
          }
      return;
    }
    default: fail("unpack_block: ", dtype_name(t), " is not a block-quantised type");
  }
}

void dequantize_blocks(DType t, const void* src, float* dst, int64_t n) {
  const int64_t bv = quant_block_values(t);
  const size_t bb = quant_block_bytes(t);
  if (n % bv != 0) fail(dtype_name(t), " needs a multiple of ", bv, " values, got ", n);
  const auto* p = static_cast<const uint8_t*>(src);
  UnpackedBlock u;
  for (int64_t b = 0; b < n / bv; ++b) {
    unpack_block(t, p + b * bb, u);
    float* y = dst + b * bv;
    for (int g = 0; g < bv / 16; ++g) {
      const float scale = u.d * static_cast<float>(u.sc[g]);
      const float min = u.dmin * static_cast<float>(u.m[g]);
      for (int i = 16 * g; i < 16 * g + 16; ++i) y[i] = scale * static_cast<float>(u.q[i]) - min;
    }
  }
}

// ---- quantisation ---------------------------------------------------------------------------

namespace {

// gguf-py's 32-value quantisers (quants.py, Q4_0/Q4_1/Q5_0/Q5_1 quantize_blocks), operation for
// operation: symmetric types use d = x[argmax |x|] / -(levels/2) and q = trunc(float32(double(x)
// * double(1/d) + levels/2 + 0.5)); asymmetric ones d = (max - min) / (levels - 1) and
// q = trunc((x - min) * (1/d) + 0.5) in float32; q clipped to [0, levels - 1].
void quantize_32(DType t, const float* x, uint8_t* out) {
  const bool symmetric = t == DType::kQ4_0 || t == DType::kQ5_0;
  const bool five = t == DType::kQ5_0 || t == DType::kQ5_1;
  const int levels = five ? 32 : 16;
  int q[32];
  float d, mn = 0;
  if (symmetric) {
    int imax = 0;
    for (int i = 1; i < 32; ++i)
      if (std::fabs(x[i]) > std::fabs(x[imax])) imax = i;  // first maximum, as numpy's argmax
    d = x[imax] / static_cast<float>(-levels / 2);
    const float id = d == 0 ? 0.f : 1.f / d;
    for (int i = 0; i < 32; ++i) {
      const float v = static_cast<float>(static_cast<double>(x[i]) * static_cast<double>(id) + (levels / 2 + 0.5));
      q[i] = std::clamp(static_cast<int>(std::trunc(v)), 0, levels - 1);
    }
  } else {
    float mx = x[0];
    mn = x[0];
    for (int i = 1; i < 32; ++i) mx = std::max(mx, x[i]), mn = std::min(mn, x[i]);
    d = (mx - mn) / static_cast<float>(levels - 1);
    const float id = d == 0 ? 0.f : 1.f / d;
    for (int i = 0; i < 32; ++i) {
      const float v = (x[i] - mn) * id + 0.5f;
      q[i] = std::clamp(static_cast<int>(std::trunc(v)), 0, levels - 1);
    }
  }
  const uint16_t dh = fp32_to_fp16(d);
  std::memcpy(out, &dh, 2);
  uint8_t* p = out + 2;
  if (!symmetric) {
    const uint16_t mh = fp32_to_fp16(mn);
    std::memcpy(p, &mh, 2);
    p += 2;
  }
  if (five) {
    uint32_t qh = 0;
    for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
    std::memcpy(p, &qh, 4);
    p += 4;
  }
  for (int l = 0; l < 16; ++l) p[l] = static_cast<uint8_t>((q[l] & 15) | (q[l + 16] & 15) << 4);
}

int round_clamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(std::clamp(v, -1e6f, 1e6f))), lo, hi);
}

// kvlab's own K-quantiser (not llama.cpp's weighted search): per 32-value sub-block the range
// [min(0, min x), max x] is split into `levels - 1` steps; the sub-block scales and mins are
// quantised to 6 bits against d = max scale / 63, dmin = max min / 63 (fp16), and each value
// rounded to the nearest level of its sub-block's quantised scale and min.
void quantize_q4k_q5k(bool q5, const float* x, uint8_t* out) {
  const int levels = q5 ? 32 : 16;
  float scale[8], min[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    hi = std::max(hi, lo);
    scale[j] = (hi - lo) / static_cast<float>(levels - 1);
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const uint16_t dh = fp32_to_fp16(max_scale / 63), mh = fp32_to_fp16(max_min / 63);
  const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0 ? round_clamp(scale[j] / d, 0, 63) : 0;
    m[j] = dmin > 0 ? round_clamp(min[j] / dmin, 0, 63) : 0;
  }
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  uint8_t* s = out + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
  uint8_t* qh = out + 16;
  uint8_t* qs = out + (q5 ? 48 : 16);
  if (q5) std::memset(qh, 0, 32);
  int q[256];
  for (int j = 0; j < 8; ++j) {
    const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(m[j]);
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = step > 0 ? round_clamp((x[32 * j + l] + off) / step, 0, levels - 1) : 0;
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
  if (q5)
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) qh[l] = static_cast<uint8_t>(qh[l] | ((q[32 * j + l] >> 4) & 1) << j);
}

// Q6_K, kvlab's own: per 16-value group s = max|x| / 31 (codes -31..31 of the -32..31 range),
// int8 group scales against d = max s / 127 (fp16).
void quantize_q6k(const float* x, uint8_t* out) {
  auto* b = reinterpret_cast<BlockQ6_K*>(out);
  float s[16], max_s = 0;
  for (int j = 0; j < 16; ++j) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
    s[j] = amax / 31;
    max_s = std::max(max_s, s[j]);
  }
  const uint16_t dh = fp32_to_fp16(max_s / 127);
  const float d = fp16_to_fp32(dh);
  std::memcpy(out + offsetof(BlockQ6_K, d), &dh, 2);
  int q[256];
  for (int j = 0; j < 16; ++j) {
    const int sc = d > 0 ? round_clamp(s[j] / d, 0, 127) : 0;
    b->scales[j] = static_cast<int8_t>(sc);
    const float step = d * static_cast<float>(sc);
    for (int l = 0; l < 16; ++l) q[16 * j + l] = (step > 0 ? round_clamp(x[16 * j + l] / step, -32, 31) : 0) + 32;
  }
  std::memset(b->ql, 0, sizeof b->ql);
  std::memset(b->qh, 0, sizeof b->qh);
  for (int h = 0; h < 2; ++h)
    for (int s2 = 0; s2 < 4; ++s2)
      for (int l = 0; l < 32; ++l) {
        const int v = q[128 * h + 32 * s2 + l];
        uint8_t& lo = b->ql[64 * h + l + 32 * (s2 & 1)];
        lo = static_cast<uint8_t>(lo | (s2 >= 2 ? (v & 15) << 4 : v & 15));
        b->qh[32 * h + l] = static_cast<uint8_t>(b->qh[32 * h + l] | ((v >> 4) & 3) << (2 * s2));
      }
}

}  // namespace

bool has_quantiser(DType t) { return is_block_quant(t) && t != DType::kQ2_K && t != DType::kQ3_K; }

void quantize_blocks(DType t, const float* src, void* dst, int64_t n) {
  const int64_t bv = quant_block_values(t);
  const size_t bb = quant_block_bytes(t);
  if (n % bv != 0) fail(dtype_name(t), " quantisation needs a multiple of ", bv, " values, got ", n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(src[i])) fail(dtype_name(t), " quantisation: value ", i, " is ", src[i]);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / bv; ++b) {
    const float* x = src + b * bv;
    uint8_t* p = out + b * bb;
    switch (t) {
      case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1: quantize_32(t, x, p); break;
      case DType::kQ4_K: quantize_q4k_q5k(false, x, p); break;
      case DType::kQ5_K: quantize_q4k_q5k(true, x, p); break;
      case DType::kQ6_K: quantize_q6k(x, p); break;
      default: fail("conversion to ", dtype_name(t), " is not supported (kvlab quantises to q4_0, q4_1, "
                    "q5_0, q5_1, q4_k, q5_k, q6_k and q8_0)");
    }
  }
}

}  // namespace kvlab
