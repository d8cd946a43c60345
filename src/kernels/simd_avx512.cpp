// The row kernels for AVX-512 (this file is compiled with -mavx512f ...).
#if defined(__x86_64__)
#define TESSERA_SIMD_NS avx512
#define TESSERA_SIMD_W 16
#include "kernels/simd_math.inc"
#include "kernels/quant_ops.inc"
#endif
