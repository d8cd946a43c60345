#include "kernels/simd.h"

#include <cstdlib>
#include <string>

#include "core/check.h"

namespace tessera::kernels {

namespace generic { const MathOps& ops(); }
#if defined(__x86_64__)
namespace avx2 { const MathOps& ops(); }
namespace avx512 { const MathOps& ops(); }
#endif

bool isa_supported(Isa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kGeneric: return true;
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == Isa::kGeneric;
#endif
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa best_isa() {
  static const Isa best = [] {
    Isa isa = isa_supported(Isa::kAvx512) ? Isa::kAvx512 : isa_supported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kGeneric;
    // TESSERA_ISA=avx2|generic caps it: an AVX-512 machine measures the
    // kernels that an AVX2-only device (or an AVX2 build of a peer) has.
    if (const char* cap = std::getenv("TESSERA_ISA"); cap != nullptr) {
      const std::string s = cap;
      if (s == "generic") isa = Isa::kGeneric;
      else if (s == "avx2" && isa == Isa::kAvx512) isa = Isa::kAvx2;
    }
    return isa;
  }();
  return best;
}

const MathOps& math_ops(Isa isa) {
  TESSERA_CHECK_MSG(isa_supported(isa), "instruction set " << isa_name(isa) << " not supported by this CPU");
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) return avx512::ops();
  if (isa == Isa::kAvx2) return avx2::ops();
#endif
  return generic::ops();
}

}  // namespace tessera::kernels
