#include "comm/collectives.h"

#include <algorithm>
#include <cstring>

#include "core/io.h"

namespace tessera::comm {

namespace {

using Clock = std::chrono::steady_clock;

Millis left(Clock::time_point deadline) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
}

// Accounts a collective call and names it in its error.
class OpScope {
 public:
  OpScope(Group& g, OpKind op) : g_(g), op_(op) {}
  core::Status done(core::Status st) {
    g_.record_op(op_, timer_.ms() / 1000.0, st.ok());
    return st.ok() ? st : st.with_context(std::string(op_name(op_)) + " on rank " + std::to_string(g_.rank()));
  }

 private:
  Group& g_;
  OpKind op_;
  core::Timer timer_;
};

core::Shape trailing_of(const core::Shape& s) { return core::Shape(s.begin() + 1, s.end()); }

// A tile from `from` must agree with ours in dtype and trailing dims, and
// have `rows` rows (rows < 0: any).
core::Status check_tile(const core::Tensor& t, core::DType dtype, const core::Shape& trailing, int64_t rows, int from) {
  const core::Shape& s = t.shape();
  const bool ok = t.dtype() == dtype && s.size() == trailing.size() + 1 &&
                  std::equal(trailing.begin(), trailing.end(), s.begin() + 1) && (rows < 0 || s[0] == rows);
  if (ok) return core::ok_status();
  core::Shape want{rows};
  want.insert(want.end(), trailing.begin(), trailing.end());
  return core::invalid_argument("rank " + std::to_string(from) + " sent " + core::dtype_name(t.dtype()) +
                                core::shape_to_string(s) + ", expected " + core::dtype_name(dtype) +
                                core::shape_to_string(want) + " (ranks disagree on the arguments)");
}

core::Status check_counts(std::span<const int64_t> counts, int world) {
  if (static_cast<int>(counts.size()) != world) {
    return core::invalid_argument("need one row count per rank (" + std::to_string(world) + "), got " +
                                  std::to_string(counts.size()));
  }
  for (int64_t c : counts) {
    if (c < 0) return core::invalid_argument("negative row count");
  }
  return core::ok_status();
}

std::vector<int64_t> offsets_of(std::span<const int64_t> counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

size_t row_bytes(const core::Tensor& t) {
  return static_cast<size_t>(core::shape_numel(trailing_of(t.shape()))) * core::dtype_size(t.dtype());
}

void copy_rows(core::Tensor& dst, int64_t row, const core::Tensor& src) {
  if (src.nbytes() == 0) return;
  std::memcpy(static_cast<char*>(dst.raw()) + static_cast<size_t>(row) * row_bytes(dst), src.raw(), src.nbytes());
}

core::Tensor make_rows(core::DType dtype, int64_t rows, const core::Shape& trailing) {
  core::Shape s{rows};
  s.insert(s.end(), trailing.begin(), trailing.end());
  return core::Tensor::zeros(dtype, std::move(s));
}

core::Status wait_sends(std::vector<SendHandle>& sends, Clock::time_point deadline) {
  for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(left(deadline)));
  return core::ok_status();
}

core::Status check_rows_input(const core::Tensor& input) {
  if (input.rank() < 1) return core::invalid_argument("input needs a leading (row) dimension");
  if (input.nbytes() > 0 && input.raw() == nullptr) return core::invalid_argument("input has no data");
  return core::ok_status();
}

// The (rows, cols) `rows` leading rows are encoded as on a compressed wire:
// a 1-D tensor's part is one row.
std::pair<int64_t, int64_t> wire_shape(const core::Shape& trailing, int64_t rows) {
  if (trailing.empty()) return {1, rows};
  return {rows, core::shape_numel(trailing)};
}

core::Status check_wire_input(const core::Tensor& input, core::WireType wire) {
  if (wire != core::WireType::kF32 && input.dtype() != core::DType::kF32)
    return core::invalid_argument(std::string("a ") + core::wire_type_name(wire) + " wire carries f32 tensors only");
  return core::ok_status();
}

core::Tensor encode_rows(const core::Tensor& t, const core::Shape& trailing, core::WireType wire) {
  if (wire == core::WireType::kF32) return t;
  const auto [rows, cols] = wire_shape(trailing, t.dim(0));
  return core::wire_encode(wire, t.f32(), rows, cols);
}

core::Status allgatherv_impl(Group& g, OpKind op, int tag, core::WireType wire, Clock::time_point deadline,
                             const core::Tensor& input, std::span<const int64_t> counts, core::Tensor* output) {
  TESSERA_RETURN_IF_ERROR(check_rows_input(input));
  TESSERA_RETURN_IF_ERROR(check_counts(counts, g.size()));
  if (counts[g.rank()] != input.dim(0)) {
    return core::invalid_argument("input has " + std::to_string(input.dim(0)) + " rows, row_counts says " +
                                  std::to_string(counts[g.rank()]));
  }
  const auto off = offsets_of(counts);
  TESSERA_RETURN_IF_ERROR(check_wire_input(input, wire));
  const core::Shape trailing = trailing_of(input.shape());
  core::Tensor out = make_rows(input.dtype(), off.back(), trailing);
  RingAllgather ring(g, AllgatherOptions{left(deadline), tag}, op);
  TESSERA_RETURN_IF_ERROR(ring.start(encode_rows(input, trailing, wire)));
  while (!ring.done()) {
    TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile(left(deadline)));
    if (wire == core::WireType::kF32) {
      TESSERA_RETURN_IF_ERROR(check_tile(t.data, input.dtype(), trailing, counts[t.index], t.index));
      copy_rows(out, off[t.index], t.data);
    } else {
      const auto [rows, cols] = wire_shape(trailing, counts[t.index]);
      TESSERA_RETURN_IF_ERROR(core::wire_decode(wire, t.data, rows, cols, out.f32() + off[t.index] * (row_bytes(out) / 4))
                                  .with_context("from rank " + std::to_string(t.index)));
    }
  }
  TESSERA_RETURN_IF_ERROR(ring.finish(left(deadline)));
  *output = std::move(out);
  return core::ok_status();
}

core::Status reduce_scatterv_impl(Group& g, OpKind op, int tag, core::WireType wire, Clock::time_point deadline,
                                  const core::Tensor& input, std::span<const int64_t> counts, core::Tensor* output) {
  TESSERA_RETURN_IF_ERROR(check_rows_input(input));
  if (input.dtype() != core::DType::kF32) return core::invalid_argument("reduce_scatter sums f32 tensors only");
  TESSERA_RETURN_IF_ERROR(check_counts(counts, g.size()));
  const auto off = offsets_of(counts);
  if (off.back() != input.dim(0)) {
    return core::invalid_argument("row counts add up to " + std::to_string(off.back()) + ", input has " +
                                  std::to_string(input.dim(0)) + " rows");
  }
  const int k = g.size(), r = g.rank();
  const core::Shape trailing = trailing_of(input.shape());
  auto block = [&](int b) { return input.rows(off[b], off[b + 1]); };
  if (k == 1) {
    *output = input.clone();
    return core::ok_status();
  }
  const int right = (r + 1) % k, left_rank = (r + k - 1) % k;
  std::vector<RecvHandle> recvs;
  for (int s = 1; s < k; ++s) recvs.push_back(g.irecv_op(op, left_rank, tag));
  std::vector<SendHandle> sends;
  // Step s sends the partial sum of block r-1-s; the block received at the
  // last step is ours.
  sends.push_back(g.isend_op(op, right, tag, encode_rows(block((r + k - 1) % k), trailing, wire)));
  for (int s = 1; s < k; ++s) {
    const int b = ((r - 1 - s) % k + k) % k;
    TESSERA_ASSIGN_OR_RETURN(core::Tensor partial, recvs[s - 1].wait(left(deadline)));
    // A fresh tensor: the received buffer may be the sender's own memory.
    core::Tensor sum = make_rows(core::DType::kF32, counts[b], trailing);
    const core::Tensor mine = block(b);
    const int64_t n = sum.numel();
    float* d = sum.f32();
    const float* m = mine.f32();
    if (wire == core::WireType::kF32) {
      TESSERA_RETURN_IF_ERROR(check_tile(partial, core::DType::kF32, trailing, counts[b], left_rank));
      const float* a = partial.f32();
      for (int64_t i = 0; i < n; ++i) d[i] = a[i] + m[i];
    } else {
      const auto [rows, cols] = wire_shape(trailing, counts[b]);
      TESSERA_RETURN_IF_ERROR(
          core::wire_decode(wire, partial, rows, cols, d).with_context("from rank " + std::to_string(left_rank)));
      for (int64_t i = 0; i < n; ++i) d[i] = d[i] + m[i];
    }
    if (s < k - 1) sends.push_back(g.isend_op(op, right, tag, encode_rows(sum, trailing, wire)));
    else *output = std::move(sum);
  }
  return wait_sends(sends, deadline);
}

}  // namespace

std::vector<int64_t> even_split(int64_t n, int k) {
  std::vector<int64_t> out(static_cast<size_t>(std::max(k, 0)), 0);
  for (int i = 0; i < k; ++i) out[i] = n / k + (i < n % k ? 1 : 0);
  return out;
}

// ---- RingAllgather -------------------------------------------------------------

RingAllgather::RingAllgather(Group& group, AllgatherOptions options, OpKind op)
    : group_(group), options_(options), op_(op) {}

core::Status RingAllgather::start(core::Tensor mine) {
  if (started_) return core::invalid_argument("RingAllgather started twice");
  started_ = true;
  mine_ = std::move(mine);
  const int k = group_.size(), r = group_.rank();
  if (k > 1) {
    const int left_rank = (r + k - 1) % k, right = (r + 1) % k;
    sends_.push_back(group_.isend_op(op_, right, options_.tag, mine_));
    // Every tile but the last goes on to the right as soon as it arrives.
    for (int s = 1; s < k; ++s) {
      if (s < k - 1) {
        SendHandle fwd;
        recvs_.push_back(group_.irecv_forward(op_, left_rank, options_.tag, right, &fwd));
        sends_.push_back(std::move(fwd));
      } else {
        recvs_.push_back(group_.irecv_op(op_, left_rank, options_.tag));
      }
    }
  }
  return core::ok_status();
}

core::Result<Tile> RingAllgather::next_tile() { return next_tile(options_.timeout); }

core::Result<Tile> RingAllgather::next_tile(Millis timeout) {
  if (!started_) return core::invalid_argument("RingAllgather::next_tile before start()");
  if (done()) return core::out_of_range("RingAllgather: no tiles left");
  const int k = group_.size(), r = group_.rank();
  const int s = next_;
  if (s == 0) {
    ++next_;
    return Tile{r, mine_};
  }
  TESSERA_ASSIGN_OR_RETURN(core::Tensor t, recvs_[s - 1].wait(timeout));
  const int index = ((r - s) % k + k) % k;
  ++next_;
  return Tile{index, std::move(t)};
}

core::Status RingAllgather::finish() { return finish(options_.timeout); }

core::Status RingAllgather::finish(Millis timeout) { return wait_sends(sends_, Clock::now() + timeout); }

// ---- collectives ---------------------------------------------------------------

core::Status broadcast(Group& g, const BroadcastOptions& o, core::Tensor* tensor) {
  OpScope scope(g, OpKind::kBroadcast);
  const auto deadline = Clock::now() + o.timeout;
  const int k = g.size();
  if (o.root < 0 || o.root >= k) return scope.done(core::invalid_argument("root out of range"));
  const int vr = (g.rank() - o.root + k) % k;
  auto real = [&](int v) { return (v + o.root) % k; };
  int mask = 1;
  while (mask < k) {
    if (vr & mask) {
      auto got = g.irecv_op(OpKind::kBroadcast, real(vr - mask), o.tag).wait(left(deadline));
      if (!got.ok()) return scope.done(got.status());
      *tensor = std::move(got).value();
      break;
    }
    mask <<= 1;
  }
  std::vector<SendHandle> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < k) sends.push_back(g.isend_op(OpKind::kBroadcast, real(vr + mask), o.tag, *tensor));
  }
  return scope.done(wait_sends(sends, deadline));
}

core::Status gatherv(Group& g, const GatherOptions& o, const core::Tensor& input, std::span<const int64_t> counts,
                     core::Tensor* output) {
  OpScope scope(g, OpKind::kGather);
  const auto deadline = Clock::now() + o.timeout;
  const int k = g.size(), r = g.rank();
  if (o.root < 0 || o.root >= k) return scope.done(core::invalid_argument("root out of range"));
  core::Status st = check_rows_input(input);
  if (st.ok()) st = check_counts(counts, k);
  if (st.ok() && counts[r] != input.dim(0)) st = core::invalid_argument("input rows disagree with row_counts");
  if (!st.ok()) return scope.done(st);
  if (r != o.root) return scope.done(g.isend_op(OpKind::kGather, o.root, o.tag, input).wait(left(deadline)));

  std::vector<RecvHandle> recvs(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) {
    if (j != r) recvs[j] = g.irecv_op(OpKind::kGather, j, o.tag);
  }
  const auto off = offsets_of(counts);
  const core::Shape trailing = trailing_of(input.shape());
  core::Tensor out = make_rows(input.dtype(), off.back(), trailing);
  copy_rows(out, off[r], input);
  for (int j = 0; j < k; ++j) {
    if (j == r) continue;
    auto got = recvs[j].wait(left(deadline));
    if (!got.ok()) return scope.done(got.status());
    st = check_tile(got.value(), input.dtype(), trailing, counts[j], j);
    if (!st.ok()) return scope.done(st);
    copy_rows(out, off[j], got.value());
  }
  *output = std::move(out);
  return scope.done(core::ok_status());
}

core::Status gather(Group& g, const GatherOptions& o, const core::Tensor& input, core::Tensor* output) {
  if (input.rank() < 1) return core::invalid_argument("gather: input needs a leading (row) dimension");
  const std::vector<int64_t> counts(static_cast<size_t>(g.size()), input.dim(0));
  return gatherv(g, o, input, counts, output);
}

core::Status allgatherv(Group& g, const AllgatherOptions& o, const core::Tensor& input,
                        std::span<const int64_t> counts, core::Tensor* output) {
  OpScope scope(g, OpKind::kAllgather);
  return scope.done(allgatherv_impl(g, OpKind::kAllgather, o.tag, o.wire, Clock::now() + o.timeout, input, counts, output));
}

core::Status allgather(Group& g, const AllgatherOptions& o, const core::Tensor& input, core::Tensor* output) {
  if (input.rank() < 1) return core::invalid_argument("allgather: input needs a leading (row) dimension");
  const std::vector<int64_t> counts(static_cast<size_t>(g.size()), input.dim(0));
  return allgatherv(g, o, input, counts, output);
}

core::Status reduce_scatterv(Group& g, const ReduceScatterOptions& o, const core::Tensor& input,
                             std::span<const int64_t> counts, core::Tensor* output) {
  OpScope scope(g, OpKind::kReduceScatter);
  return scope.done(
      reduce_scatterv_impl(g, OpKind::kReduceScatter, o.tag, o.wire, Clock::now() + o.timeout, input, counts, output));
}

core::Status reduce_scatter(Group& g, const ReduceScatterOptions& o, const core::Tensor& input, core::Tensor* output) {
  if (input.rank() < 1) return core::invalid_argument("reduce_scatter: input needs a leading (row) dimension");
  return reduce_scatterv(g, o, input, even_split(input.dim(0), g.size()), output);
}

core::Status allreduce(Group& g, const AllreduceOptions& o, core::Tensor* tensor) {
  OpScope scope(g, OpKind::kAllreduce);
  const auto deadline = Clock::now() + o.timeout;
  if (tensor->dtype() != core::DType::kF32) return scope.done(core::invalid_argument("allreduce sums f32 tensors only"));
  const core::Shape shape = tensor->shape();
  const core::Tensor flat = tensor->reshaped({tensor->numel()});
  const auto counts = even_split(flat.numel(), g.size());
  core::Tensor part, whole;
  core::Status st = reduce_scatterv_impl(g, OpKind::kAllreduce, o.tag, o.wire, deadline, flat, counts, &part);
  // Both phases share the (left neighbour, allreduce, tag) mailbox; receives
  // are matched in posting order, so the phases cannot mix.
  if (st.ok()) st = allgatherv_impl(g, OpKind::kAllreduce, o.tag, o.wire, deadline, part, counts, &whole);
  if (st.ok()) *tensor = whole.reshaped(shape);
  return scope.done(st);
}

core::Status barrier(Group& g, const BarrierOptions& o) {
  OpScope scope(g, OpKind::kBarrier);
  const auto deadline = Clock::now() + o.timeout;
  const int k = g.size(), r = g.rank();
  const core::Tensor token = core::Tensor::zeros(core::DType::kU8, {0});
  std::vector<SendHandle> sends;
  for (int d = 1; d < k; d <<= 1) {
    RecvHandle in = g.irecv_op(OpKind::kBarrier, (r - d + k) % k, o.tag);
    sends.push_back(g.isend_op(OpKind::kBarrier, (r + d) % k, o.tag, token));
    auto got = in.wait(left(deadline));
    if (!got.ok()) return scope.done(got.status());
  }
  return scope.done(wait_sends(sends, deadline));
}

}  // namespace tessera::comm
