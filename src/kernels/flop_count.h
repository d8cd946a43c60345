// FLOPs of the matrix products this thread asked the kernels for (2 per
// multiply-add), counted where every product enters the library, so tests
// can check a strategy's estimate against what actually ran. A thread-local
// sum: ranks run as threads each count their own.
#pragma once

namespace tessera::kernels {

void count_flops(double flops);
double thread_flops();
void reset_thread_flops();

}  // namespace tessera::kernels
