// The SIMD paths of quant_matvec.h: per weight block, the integer codes are unpacked into 32-byte
// registers (nibbles / bit planes by shifts and masks), multiplied with the int8 activations
// (AVX2: vpmaddubsw on |q| and sign(a, q), then vpmaddwd with ones or the group scales; VNNI:
// vpdpbusd for unit scales), summed exactly into the contract's 8 int32 lanes, converted and
// accumulated with one fma per block into a vector of 8 fp32 lanes, summed once per output in the
// contract's tree order. Compiled with -ffp-contract=off; the functions carry target attributes,
// so this file adds nothing a baseline x86-64 CPU cannot run unless it is called.
#include <immintrin.h>

#include <cstring>

#include "kernels/common/error.h"
#include "kernels/cpu/quant_matvec.h"

namespace kvlab::detail {

namespace avx2 {
#define KVLAB_QTARGET __attribute__((target("avx2,fma,f16c")))
#define KVLAB_QVNNI 0
#include "kernels/cpu/quant_matvec_simd.inc"
#undef KVLAB_QTARGET
#undef KVLAB_QVNNI
}  // namespace avx2

namespace vnni {
#define KVLAB_QTARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define KVLAB_QVNNI 1
#include "kernels/cpu/quant_matvec_simd.inc"
#undef KVLAB_QTARGET
#undef KVLAB_QVNNI
}  // namespace vnni

void quant_matvec_rows_avx2(const WeightView& w, const QuantActivations& a, float* y, int64_t r0, int64_t r1) {
  avx2::dispatch(w, a, y, r0, r1);
}
void quant_matvec_rows_vnni(const WeightView& w, const QuantActivations& a, float* y, int64_t r0, int64_t r1) {
  vnni::dispatch(w, a, y, r0, r1);
}

}  // namespace kvlab::detail
