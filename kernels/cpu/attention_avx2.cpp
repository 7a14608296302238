// The AVX2+FMA instance of the tiled attention kernel: attention.cpp compiled a second time with
// its functions under target("avx2,fma") (so this object runs only where cpu_path() says kAvx2;
// attention() in the portable instance dispatches).
#define KVLAB_ATTENTION_AVX2 1
#include "kernels/cpu/attention.cpp"  // NOLINT(bugprone-suspicious-include): one source, two ISAs
