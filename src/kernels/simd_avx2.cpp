// The row kernels for AVX2 + FMA (compiled with -mavx2 -mfma -mno-avx512f).
#if defined(__x86_64__)
#define TESSERA_SIMD_NS avx2
#define TESSERA_SIMD_W 8
#include "kernels/simd_math.inc"
#include "kernels/quant_ops.inc"
#endif
