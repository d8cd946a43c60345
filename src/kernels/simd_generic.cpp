// The row kernels for any CPU (the build's own flags; 8-wide vectors that the
// compiler lowers to what it has).
#define TESSERA_SIMD_NS generic
#define TESSERA_SIMD_W 8
#include "kernels/simd_math.inc"
#include "kernels/quant_ops.inc"
