// cuBLAS calls of gemm.h. Row-major y[n, out] = x[n, in] W^T is, in cuBLAS's column-major
// terms, y^T[out, n] = W[out, in] (W^T viewed col-major, transposed back) x^T[in, n]:
// cublasGemmEx(OP_T, OP_N, m = out, n = n, k = in, A = W (lda in), B = x (ldb in), C = y (ldc out)).
#include "kernels/cuda/gemm.h"

#include "kernels/cuda/cuda_check.h"

namespace kvlab::cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error in ", what, ": ", cublasGetStatusName(status), " (",
         cublasGetStatusString(status), ")");
}

}  // namespace

Gemm::Gemm() {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  // Explicitly the default math mode (no TF32 tensor-op math for fp32 calls); the fp32 path
  // asks for the pedantic compute type on top of it.
  check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void Gemm::run(const void* x, const void* w, cudaDataType in_type, void* y, cudaDataType y_type,
               cublasComputeType_t compute, int n, int in, int out, float beta,
               cudaStream_t stream) {
  if (n <= 0 || in <= 0 || out <= 0) return;
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  const float alpha = 1.f;
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in_type, in,
                            x, in_type, in, &beta, y, y_type, out, compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int n, int in, int out,
                  cudaStream_t stream, bool accumulate) {
  run(x, w, CUDA_R_16BF, y, CUDA_R_32F, CUBLAS_COMPUTE_32F, n, in, out, accumulate ? 1.f : 0.f,
      stream);
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int n, int in,
                  int out, cudaStream_t stream) {
  run(x, w, CUDA_R_16BF, y, CUDA_R_16BF, CUBLAS_COMPUTE_32F, n, in, out, 0.f, stream);
}

void Gemm::linear(const float* x, const float* w, float* y, int n, int in, int out,
                  cudaStream_t stream, bool accumulate) {
  run(x, w, CUDA_R_32F, y, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC, n, in, out,
      accumulate ? 1.f : 0.f, stream);
}

}  // namespace kvlab::cuda
