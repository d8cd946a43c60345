#include "kernels/flop_count.h"

namespace tessera::kernels {

namespace {
thread_local double g_flops = 0.0;
}  // namespace

void count_flops(double flops) { g_flops += flops; }
double thread_flops() { return g_flops; }
void reset_thread_flops() { g_flops = 0.0; }

}  // namespace tessera::kernels
