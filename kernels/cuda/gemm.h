// GEMMs of the forward pass through cuBLAS: bf16 inputs, fp32 accumulation (the weights stay in
// bf16 on the device, as the issue asks; cuBLAS picks tensor-core kernels); and an fp32 path that
// is exact to fp32 (fp32 products and sums, never TF32), for fp32 weights and the references.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvlab::cuda {

class Gemm {
 public:
  Gemm();  // creates the cuBLAS handle; throws kvlab::Error without a device
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[n, out] (=|+=) x[n, in] @ W[out, in]^T   (all row-major; W as stored in model files,
  // rows = output features). y fp32; accumulate adds to y (beta = 1) instead of overwriting.
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int n, int in, int out,
              cudaStream_t stream = nullptr, bool accumulate = false);
  // The same with a bf16 output.
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int n, int in,
              int out, cudaStream_t stream = nullptr);
  // The same contract in fp32: x, W, y fp32 with CUBLAS_COMPUTE_32F_PEDANTIC (fp32 multiplies and
  // adds; no TF32 or other down-converting fast path, whatever the handle's math mode).
  void linear(const float* x, const float* w, float* y, int n, int in, int out,
              cudaStream_t stream = nullptr, bool accumulate = false);

 private:
  void run(const void* x, const void* w, cudaDataType in_type, void* y, cudaDataType y_type,
           cublasComputeType_t compute, int n, int in, int out, float beta, cudaStream_t stream);
  cublasHandle_t handle_ = nullptr;
};

}  // namespace kvlab::cuda
