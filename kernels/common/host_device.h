// KVLAB_HD marks functions compiled for both host and device (CUDA); plain inline on the host.
#pragma once

#if defined(__CUDACC__)
#define KVLAB_HD __host__ __device__ __forceinline__
#else
#define KVLAB_HD inline
#endif
