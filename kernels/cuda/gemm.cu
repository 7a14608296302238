// cuBLAS calls of gemm.h. Row-major y[n, out] = x[n, in] W^T is, in cuBLAS's column-major
// terms, y^T[out, n] = W[out, in] (W^T viewed col-major, transposed back) x^T[in, n]:
// cublasGemmEx(OP_T, OP_N, m = out, n = n, k = in, A = W (lda in), B = x (ldb in), C = y (ldc out)).
#include "kernels/cuda/gemm.h"

#include "framework/core/error.h"

namespace kvlab::cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error in ", what, ": ", cublasGetStatusName(status), " (",
         cublasGetStatusString(status), ")");
}

}  // namespace

Gemm::Gemm() { check_cublas(cublasCreate(&handle_), "cublasCreate"); }

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void Gemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType y_type,
               int n, int in, int out, float beta, cudaStream_t stream) {
  if (n <= 0 || in <= 0 || out <= 0) return;
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  const float alpha = 1.f;
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, CUDA_R_16BF,
                            in, x, CUDA_R_16BF, in, &beta, y, y_type, out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int n, int in, int out,
                  cudaStream_t stream, bool accumulate) {
  run(x, w, y, CUDA_R_32F, n, in, out, accumulate ? 1.f : 0.f, stream);
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int n, int in,
                  int out, cudaStream_t stream) {
  run(x, w, y, CUDA_R_16BF, n, in, out, 0.f, stream);
}

}  // namespace kvlab::cuda
