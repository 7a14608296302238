// GEMMs of the forward pass through cuBLAS: bf16 inputs, fp32 accumulation (the weights stay in
// bf16 on the device, as the issue asks; cuBLAS picks tensor-core kernels).
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

 private:
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType y_type, int n,
           int in, int out, float beta, cudaStream_t stream);
  cublasHandle_t handle_ = nullptr;
};

}  // namespace kvlab::cuda
