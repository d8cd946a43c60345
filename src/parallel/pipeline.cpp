// Inter-layer placement: any assignment of layers to devices (also back and
// forth), activations sent device to device, and weight pre-loading: while
// a device waits for its next input it pages that stage's weights in.
#include <sys/mman.h>
#include <unistd.h>

#include <thread>

#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

// Asks the kernel to read the stage's weight pages (mmap'd tensors are read
// lazily) and touches them, so the first GEMM finds them in memory.
void preload(const model::Transformer& model, Range layers) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t l = layers.begin; l < layers.end; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    for (const kernels::PackedLinear* t : {&w.qkv_w, &w.attn_out_w, &w.ffn_in_w, &w.ffn_out_w}) {
      if (t->empty() || t->nbytes() == 0) continue;
      const auto addr = reinterpret_cast<uintptr_t>(t->raw());
      const uintptr_t start = addr & ~(page - 1);
      ::madvise(reinterpret_cast<void*>(start), t->nbytes() + (addr - start), MADV_WILLNEED);
      volatile unsigned char sink = 0;
      for (size_t off = 0; off < t->nbytes(); off += page) sink = sink + static_cast<const unsigned char*>(t->raw())[off];
    }
  }
}

}  // namespace

Result<Tensor> run_pipeline(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                            core::ThreadPool* pool) {
  const int64_t F = model.config().hidden;
  const int me = sync.rank();
  int holder = 0;  // the device that holds the activations now
  Tensor cur = me == 0 ? x : Tensor::zeros_f32({n, F});
  model::Workspace ws;
  for (const auto& stage : plan.layers.stages()) {
    if (stage.device != holder) {
      if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(stage.device, cur.f32(), n * F));
      if (me == stage.device) {
        std::thread pre([&] { preload(model, stage.layers); });
        const core::Status st = sync.recv(holder, cur.f32(), n * F);
        pre.join();
        TESSERA_RETURN_IF_ERROR(st);
      }
      holder = stage.device;
    }
    if (me == holder)
      for (int64_t l = stage.layers.begin; l < stage.layers.end; ++l) model.layer(l, cur, 0, nullptr, ws, pool);
  }
  if (holder != 0) {
    if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(0, cur.f32(), n * F));
    if (me == 0) TESSERA_RETURN_IF_ERROR(sync.recv(holder, cur.f32(), n * F));
  }
  return me == 0 ? cur : Tensor();
}

}  // namespace tessera::parallel
