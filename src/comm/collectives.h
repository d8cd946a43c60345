// Collectives over a Group, gloo style: an options struct and a free
// function per operation, each bounded by options.timeout (one deadline for
// the whole call). Parts may be uneven or empty: the v-variants take one row
// count per rank (for 1-D tensors rows are elements). Rows are the leading
// dimension; trailing dimensions and dtype must agree across ranks, which is
// checked against what arrives. Outputs are new tensors; input buffers are
// never written (they may still be shared with the transport).
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include "comm/group.h"
#include "core/wire_format.h"

namespace tessera::comm {

struct BroadcastOptions {
  Millis timeout{30000};
  int tag = 0;
  int root = 0;
};

struct GatherOptions {
  Millis timeout{30000};
  int tag = 0;
  int root = 0;
};

// `wire` (f32 tensors only): each part travels encoded (core/wire_format.h)
// and every rank's output holds the decoded parts, its own included, so all
// ranks hold the same values. Sums are kept in F32: a partial sum is decoded,
// added to and encoded again at each hop. A 1-D tensor's part is one row.
struct AllgatherOptions {
  Millis timeout{30000};
  int tag = 0;
  core::WireType wire = core::WireType::kF32;
};

struct ReduceScatterOptions {
  Millis timeout{30000};
  int tag = 0;
  core::WireType wire = core::WireType::kF32;
};

struct AllreduceOptions {
  Millis timeout{30000};
  int tag = 0;
  core::WireType wire = core::WireType::kF32;
};

struct BarrierOptions {
  Millis timeout{30000};
  int tag = 0;
};

// Binomial tree from the root. On the root *tensor is the input; on the
// others it is replaced with the root's tensor (any dtype and shape).
core::Status broadcast(Group& group, const BroadcastOptions& options, core::Tensor* tensor);

// Concatenation of every rank's input along rows, in rank order, on the
// root (*output untouched elsewhere). gather: every input has the same
// shape; gatherv: row_counts[r] rows from rank r.
core::Status gather(Group& group, const GatherOptions& options, const core::Tensor& input, core::Tensor* output);
core::Status gatherv(Group& group, const GatherOptions& options, const core::Tensor& input,
                     std::span<const int64_t> row_counts, core::Tensor* output);

// Ring allgather: every rank gets the concatenation of all inputs.
core::Status allgather(Group& group, const AllgatherOptions& options, const core::Tensor& input, core::Tensor* output);
core::Status allgatherv(Group& group, const AllgatherOptions& options, const core::Tensor& input,
                        std::span<const int64_t> row_counts, core::Tensor* output);

// Ring reduce-scatter, sum, f32: input is the full [sum(row_counts), ...]
// tensor on every rank; rank r gets the sum over ranks of its row_counts[r]
// rows. reduce_scatter splits rows evenly (first ranks get the remainder).
core::Status reduce_scatter(Group& group, const ReduceScatterOptions& options, const core::Tensor& input,
                            core::Tensor* output);
core::Status reduce_scatterv(Group& group, const ReduceScatterOptions& options, const core::Tensor& input,
                             std::span<const int64_t> row_counts, core::Tensor* output);

// Ring allreduce (reduce-scatter then allgather), sum, f32; *tensor is
// replaced by a new tensor of the same shape holding the sum.
core::Status allreduce(Group& group, const AllreduceOptions& options, core::Tensor* tensor);

// Dissemination barrier: returns once every rank has entered it.
core::Status barrier(Group& group, const BarrierOptions& options);

// Even split of n items over k parts (the first n % k parts get one more).
std::vector<int64_t> even_split(int64_t n, int k);

struct Tile {
  int index = 0;  // the rank the tile belongs to
  core::Tensor data;
};

// Ring allgather one step at a time, so that a caller can compute on tile i
// while tile i+1 is in flight (Galaxy-style overlap):
//
//   RingAllgather ring(group, opts);
//   TESSERA_RETURN_IF_ERROR(ring.start(my_tile));
//   while (!ring.done()) {
//     TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile());
//     compute(t);  // the tile is already on its way to the next rank
//   }
//   TESSERA_RETURN_IF_ERROR(ring.finish());
//
// Tiles come in ring order: our own first, then rank r-1, r-2, ... (mod K).
// All receives are posted by start(), so every tile streams in meanwhile.
// A tile's buffer is shared with its onward send: read it, never write it.
class RingAllgather {
 public:
  RingAllgather(Group& group, AllgatherOptions options, OpKind op = OpKind::kAllgather);

  core::Status start(core::Tensor mine);
  bool done() const { return next_ >= group_.size(); }
  // Waits at most `timeout` (default options.timeout) for the next tile.
  core::Result<Tile> next_tile();
  core::Result<Tile> next_tile(Millis timeout);
  // Whether next_tile() would return at once (true when none is left).
  bool next_ready() const { return done() || next_ == 0 || recvs_[static_cast<size_t>(next_ - 1)].ready(); }
  // Waits for our sends to be taken by the transport.
  core::Status finish();
  core::Status finish(Millis timeout);

 private:
  Group& group_;
  AllgatherOptions options_;
  OpKind op_;
  bool started_ = false;
  int next_ = 0;
  core::Tensor mine_;
  std::vector<RecvHandle> recvs_;
  std::vector<SendHandle> sends_;
};

}  // namespace tessera::comm
