#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/check.h"
#include "model/arch/architecture.h"

namespace tessera::model {

using core::Result;
using core::Shape;
using core::Tensor;

namespace {

struct Entry {
  std::string name;  // full name, prefix applied
  Shape shape;
  bool required = true;
};

const TensorNames& names_of(const ModelConfig& c) {
  TESSERA_CHECK_MSG(c.arch != nullptr, "a config without its family unit (parse_config sets it)");
  return c.arch->names();
}

std::string layer_name(const ModelConfig& c, int64_t l, const std::string& leaf) {
  return names_of(c).layers + std::to_string(l) + "." + leaf;
}

// A Llama-style layer's tensors ([out, in]); biases and q/k norms as the
// config has them.
void add_llama_entries(const ModelConfig& c, int64_t l, const std::string& p, std::vector<Entry>* out) {
  const int64_t F = c.hidden, I = c.intermediate, d = c.head_dim();
  const LayerNames& n = names_of(c).layer;
  auto add = [&](const std::string& leaf, Shape s) { out->push_back({p + layer_name(c, l, leaf), s, true}); };
  add(n.ln1_g, {F});
  const int64_t rows[3] = {c.q_width(), c.kv_width(), c.kv_width()};
  for (size_t i = 0; i < 3; ++i) {
    add(n.qkv_w[i], {rows[i], F});
    if (c.attention_bias) add(n.qkv_b[i], {rows[i]});
  }
  add(n.attn_out_w, {F, c.q_width()});
  if (c.o_bias) add(n.attn_out_b, {F});
  if (c.qk_norm) {
    add(n.q_norm, {d});
    add(n.k_norm, {d});
  }
  add(n.ln2_g, {F});
  for (size_t i = 0; i < n.ffn_in_w.size(); ++i) {
    add(n.ffn_in_w[i], {I, F});
    if (c.mlp_bias) add(n.ffn_in_b[i], {I});
  }
  add(n.ffn_out_w, {F, I});
  if (c.mlp_bias) add(n.ffn_out_b, {F});
}

// The tensors of one ordinary layer, or of one sub-block (`sub` =
// "blocks.{i}.", residual width F = h/N) of a decoupled layer.
void add_block_entries(const ModelConfig& c, int64_t l, const std::string& sub, int64_t F, const std::string& p,
                       std::vector<Entry>* out) {
  const int64_t H = c.hidden, I = c.intermediate;  // attention and FFN widths stay whole
  const LayerNames& n = names_of(c).layer;
  auto add = [&](const std::string& leaf, Shape s, bool req = true) { out->push_back({p + layer_name(c, l, sub + leaf), s, req}); };
  auto norms = [&] {
    for (const std::string* ln : {&n.ln1_g, &n.ln1_b, &n.ln2_g, &n.ln2_b}) add(*ln, {F});
  };
  if (n.conv1d) {  // [in, out], in the order Hugging Face writes them
    norms();
    add(n.qkv_w[0], {F, 3 * H});
    add(n.qkv_b[0], {3 * H});
    add(n.attn_out_w, {H, F});
    add(n.attn_out_b, {F});
    add(n.ffn_in_w[0], {F, I});
    add(n.ffn_in_b[0], {I});
    add(n.ffn_out_w, {I, F});
    add(n.ffn_out_b, {F});
    return;
  }
  for (size_t i = 0; i < n.qkv_w.size(); ++i) {  // [out, in]
    add(n.qkv_w[i], {H, F});
    add(n.qkv_b[i], {H}, c.qkv_bias);
  }
  add(n.attn_out_w, {F, H});
  add(n.attn_out_b, {F});
  add(n.ffn_in_w[0], {I, F});
  add(n.ffn_in_b[0], {I});
  add(n.ffn_out_w, {F, I});
  add(n.ffn_out_b, {F});
  norms();
}

std::string block_prefix(int64_t i) { return "blocks." + std::to_string(i) + "."; }

void add_layer_entries(const ModelConfig& c, int64_t l, const std::string& p, std::vector<Entry>* out) {
  if (c.llama_style()) return add_llama_entries(c, l, p, out);
  if (!c.decoupled(l)) return add_block_entries(c, l, "", c.hidden, p, out);
  for (int64_t i = 0; i < c.bp_div; ++i) add_block_entries(c, l, block_prefix(i), c.block_width(), p, out);
}

// The tensors around the layers, as the recipe has them: entries_for and
// load_weights both follow it.
std::vector<Entry> entries_for(const ModelConfig& c, const std::string& p) {
  const int64_t F = c.hidden, W = c.token_width();
  const BaseNames& b = names_of(c).base;
  std::vector<Entry> e;
  if (c.takes_images()) {
    const int64_t ps = c.patch_size;
    e.push_back({p + b.cls, {1, 1, F}});
    e.push_back({p + b.pos, {1, c.max_rows(), F}});
    e.push_back({p + b.patch_w, {F, c.channels, ps, ps}});
    e.push_back({p + b.patch_b, {F}});
  } else {
    e.push_back({p + b.word, {c.vocab, W}});
    if (c.learned_positions) e.push_back({p + b.pos, {c.max_positions + c.position_offset, F}});
    if (c.has_token_types()) e.push_back({p + b.type, {c.type_vocab, F}});
    if (c.embed_norm) {
      e.push_back({p + b.emb_ln_g, {F}});
      e.push_back({p + b.emb_ln_b, {F}});
    }
    if (c.projects_embeddings()) e.push_back({p + b.project_in, {F, W}});
  }
  for (int64_t l = 0; l < c.layers; ++l) add_layer_entries(c, l, p, &e);
  if (c.final_norm) {
    e.push_back({p + b.final_ln_g, {F}});
    if (!c.llama_style()) e.push_back({p + b.final_ln_b, {F}});  // RMSNorm has no bias
  }
  if (c.projects_embeddings()) e.push_back({p + b.project_out, {W, F}});
  if (c.causal()) {
    // A tied head reads the embeddings; a checkpoint may still store it.
    if (c.head == HeadKind::kLmHead) e.push_back({b.lm_head, {c.vocab, W}, !c.tied_head});
    return e;
  }
  // A classifier that reads the pooler needs it; otherwise it is optional.
  const bool pooler_required = c.pooled_head && c.head != HeadKind::kNone;
  e.push_back({p + b.pooler_w, {F, F}, pooler_required});
  e.push_back({p + b.pooler_b, {F}, pooler_required});
  if (c.head != HeadKind::kNone) {
    e.push_back({b.classifier_w, {c.num_labels(), F}});
    e.push_back({b.classifier_b, {c.num_labels()}});
  }
  return e;
}

// Buffers and heads of other tasks that checkpoints carry and inference ignores.
bool ignorable(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends_with("attn.bias") || ends_with("attn.masked_bias") || ends_with("position_ids") ||
         ends_with("rotary_emb.inv_freq") ||
         name.rfind("cls.", 0) == 0;
}

std::string detect_prefix(const ModelConfig& c, const TensorStore& store) {
  const TensorNames& n = names_of(c);
  const std::string probe = c.takes_images() ? n.base.cls : n.base.word;
  return store.contains(n.wrapper + probe) ? n.wrapper : "";
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  const int64_t cols = parts[0].rank() == 2 ? parts[0].dim(1) : 1;
  for (const auto& t : parts) rows += t.dim(0);
  Tensor out = Tensor::zeros_f32(parts[0].rank() == 2 ? Shape{rows, cols} : Shape{rows});
  float* dst = out.f32();
  for (const auto& t : parts) {
    std::memcpy(dst, t.f32(), t.nbytes());
    dst += t.numel();
  }
  return out;
}

// A weight matrix as the file holds it, before packing: rows of one or more
// tensors (views into the mapping, kept alive by `held`).
struct RawMatrix {
  std::vector<Tensor> held;
  std::vector<kernels::WeightSource> parts;
  int64_t k = 0;
  std::vector<std::shared_ptr<const void>> keep;  // what block parts point into
};

RawMatrix blocks_of(const TensorStore::Blocks& b) {  // a file's quantized rows [rows, k]
  kernels::WeightSource s;
  s.rows = b.rows;
  s.blocks = b.data;
  s.block_type = b.type;
  s.block_stride = kernels::row_bytes(b.type, b.k);
  return {{}, {s}, b.k, {b.keep}};
}

// A block part widened to F32 [rows, k] (held by `into`): a cut that does
// not fall on its blocks.
kernels::WeightSource widened(const kernels::WeightSource& s, int64_t k, RawMatrix& into) {
  Tensor t = Tensor::zeros_f32({std::max<int64_t>(s.rows, 1), k});
  for (int64_t i = 0; i < s.rows; ++i)
    kernels::dequantize_row_ref(s.block_type, s.blocks + static_cast<size_t>(i) * s.block_stride, k, t.f32() + i * k);
  into.held.push_back(t);
  return {t.f32(), s.rows, k, 1};
}

RawMatrix linear_of(const Tensor& t) {  // Linear [out, in]
  return {{t}, {{t.f32(), t.dim(0), t.dim(1), 1}}, t.dim(1), {}};
}

RawMatrix conv1d_of(const Tensor& t) {  // GPT-2 Conv1D [in, out]: a row is a column
  return {{t}, {{t.f32(), t.dim(1), 1, t.dim(1)}}, t.dim(0), {}};
}

// Rows [r0, r1) of the stacked parts.
RawMatrix rows_of(const RawMatrix& m, int64_t r0, int64_t r1) {
  RawMatrix out{m.held, {}, m.k, m.keep};
  int64_t at = 0;
  for (const auto& s : m.parts) {
    const int64_t b = std::max(r0, at), e = std::min(r1, at + s.rows);
    if (b < e) {
      kernels::WeightSource p = s;
      p.rows = e - b;
      if (s.blocks != nullptr) p.blocks = s.blocks + static_cast<size_t>(b - at) * s.block_stride;
      else p.data = s.data + (b - at) * s.row_stride;
      out.parts.push_back(p);
    }
    at += s.rows;
  }
  return out;
}

// Columns [c0, c1): block parts cut on whole blocks, else widened.
RawMatrix cols_of(const RawMatrix& m, int64_t c0, int64_t c1) {
  RawMatrix out{m.held, {}, c1 - c0, m.keep};
  for (const auto& s : m.parts) {
    if (s.blocks == nullptr) {
      out.parts.push_back({s.data + c0 * s.col_stride, s.rows, s.row_stride, s.col_stride});
      continue;
    }
    const int64_t be = kernels::block_elems(s.block_type);
    if (c1 == c0) {
      out.parts.push_back({nullptr, s.rows, 0, 1});
    } else if (c0 % be == 0 && (c1 - c0) % be == 0) {
      kernels::WeightSource p = s;
      p.blocks = s.blocks + static_cast<size_t>(c0 / be) * kernels::block_bytes(s.block_type);
      out.parts.push_back(p);
    } else {
      const kernels::WeightSource w = widened(s, m.k, out);
      out.parts.push_back({w.data + c0, w.rows, w.row_stride, 1});
    }
  }
  return out;
}

RawMatrix stack(const std::vector<RawMatrix>& ms, int64_t k) {
  RawMatrix out{{}, {}, k, {}};
  for (const auto& m : ms) {
    out.held.insert(out.held.end(), m.held.begin(), m.held.end());
    out.parts.insert(out.parts.end(), m.parts.begin(), m.parts.end());
    out.keep.insert(out.keep.end(), m.keep.begin(), m.keep.end());
  }
  return out;
}

kernels::PackedLinear pack(const RawMatrix& m, const kernels::PackedLinear::Consumed& consumed,
                           kernels::WeightType type) {
  return kernels::PackedLinear::pack(m.parts, m.k, kernels::gemm_path(), consumed, type);
}

// A layer as read, before packing; `names` are the file tensors it came from.
struct RawLayer {
  RawMatrix qkv, attn_out, ffn_in, ffn_out;
  Tensor qkv_b, attn_out_b, ffn_in_b, ffn_out_b, ln1_g, ln1_b, ln2_g, ln2_b, q_norm, k_norm;
  std::vector<std::string> names;
};

// The whole layer's widths a shard is cut from: Q and K/V rows of the fused
// QKV matrix, FFN columns, and whether FFN-in is [gate; up] (Llama-style).
struct LayerDims {
  int64_t F = 0, Q = 0, KV = 0, I = 0;
  bool gated = false;
};

LayerDims dims_of(const ModelConfig& c) {
  return {c.hidden, c.q_width(), c.kv_width(), c.intermediate, c.llama_style()};
}

// Query heads s.h0..s.h1 with the K/V heads they read (HeadShard) and FFN
// columns [c0, c1) of a whole layer.
RawLayer shard_raw(const RawLayer& full, const LayerDims& dim, const HeadShard& s, int64_t c0, int64_t c1) {
  RawLayer out = full;
  const int64_t d = s.head_dim;
  const int64_t starts[3] = {s.h0 * d, dim.Q + s.kv0 * d, dim.Q + dim.KV + s.kv0 * d};
  const int64_t sizes[3] = {s.q_width(), s.kv_width(), s.kv_width()};
  std::vector<RawMatrix> w;
  std::vector<Tensor> b;
  for (int part = 0; part < 3; ++part) {
    w.push_back(rows_of(full.qkv, starts[part], starts[part] + sizes[part]));
    if (!full.qkv_b.empty()) b.push_back(full.qkv_b.rows(starts[part], starts[part] + sizes[part]));
  }
  out.qkv = stack(w, dim.F);
  out.qkv_b = full.qkv_b.empty() ? Tensor() : s.heads() > 0 ? concat_rows(b) : Tensor::zeros_f32({0});
  out.attn_out = cols_of(full.attn_out, s.h0 * d, s.h1 * d);
  if (dim.gated) {  // the same columns of gate and of up
    out.ffn_in = stack({rows_of(full.ffn_in, c0, c1), rows_of(full.ffn_in, dim.I + c0, dim.I + c1)}, dim.F);
    if (!full.ffn_in_b.empty())
      out.ffn_in_b = c1 > c0 ? concat_rows({full.ffn_in_b.rows(c0, c1), full.ffn_in_b.rows(dim.I + c0, dim.I + c1)})
                             : Tensor::zeros_f32({0});
  } else {
    out.ffn_in = rows_of(full.ffn_in, c0, c1);
    out.ffn_in_b = full.ffn_in_b.rows(c0, c1);
  }
  out.ffn_out = cols_of(full.ffn_out, c0, c1);
  return out;
}

// Packs the matrices and copies the vectors, so nothing refers to the file;
// `consumed` hears of the source ranges each pack has read.
// An owned copy; a tensor a family does not have stays empty.
Tensor owned_copy(const Tensor& t) { return t.empty() ? Tensor() : t.clone(); }

// A matrix is quantized when the whole layer's rows are whole blocks (`full_k`
// its input width before any shard cut), so a shard holds exactly the
// single device's blocks, or stays F32 exactly where the single device does.
kernels::WeightType fit(kernels::WeightType type, int64_t full_k) {
  return kernels::holds(type, full_k) ? type : kernels::WeightType::kF32;
}

LayerWeights finish_layer(const RawLayer& r, const kernels::PackedLinear::Consumed& consumed,
                          kernels::WeightType type, int64_t full_attn_k, int64_t full_ffn_k) {
  LayerWeights w;
  w.qkv_w = pack(r.qkv, consumed, fit(type, r.qkv.k));
  w.attn_out_w = pack(r.attn_out, consumed, fit(type, full_attn_k));
  w.ffn_in_w = pack(r.ffn_in, consumed, fit(type, r.ffn_in.k));
  w.ffn_out_w = pack(r.ffn_out, consumed, fit(type, full_ffn_k));
  w.qkv_b = owned_copy(r.qkv_b);
  w.attn_out_b = owned_copy(r.attn_out_b);
  w.ffn_in_b = owned_copy(r.ffn_in_b);
  w.ffn_out_b = owned_copy(r.ffn_out_b);
  w.ln1_g = owned_copy(r.ln1_g);
  w.ln1_b = owned_copy(r.ln1_b);
  w.ln2_g = owned_copy(r.ln2_g);
  w.ln2_b = owned_copy(r.ln2_b);
  w.q_norm = owned_copy(r.q_norm);
  w.k_norm = owned_copy(r.k_norm);
  return w;
}

class Loader {
 public:
  Loader(const TensorStore& store, const ModelConfig& c, std::string prefix, kernels::WeightType type)
      : store_(store), c_(c), p_(std::move(prefix)), type_(type) {}
  kernels::WeightType type() const { return type_; }

  Result<Tensor> get(const std::string& name) { return store_.get_f32(name); }
  Result<Tensor> base(const std::string& leaf) { return get(p_ + leaf); }
  Result<Tensor> layer(int64_t l, const std::string& leaf, RawLayer& into) {
    into.names.push_back(p_ + layer_name(c_, l, leaf));
    return get(into.names.back());
  }
  // A Linear-layout matrix of layer l: the file's own blocks when the load
  // keeps the file's type (a quantized GGUF), else read as F32.
  Result<RawMatrix> linear(int64_t l, const std::string& leaf, RawLayer& into) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<RawMatrix> b, file_matrix(l, leaf, into));
    if (b) return std::move(*b);
    TESSERA_ASSIGN_OR_RETURN(Tensor t, layer(l, leaf, into));
    return linear_of(t);
  }
  // Layer l's matrix as the file's own blocks (Linear rows whichever way the
  // folder holds it), or nullopt where the load does not keep them.
  Result<std::optional<RawMatrix>> file_matrix(int64_t l, const std::string& leaf, RawLayer& into) {
    if (!file_blocks()) return std::optional<RawMatrix>();
    const std::string name = p_ + layer_name(c_, l, leaf);
    TESSERA_ASSIGN_OR_RETURN(std::optional<TensorStore::Blocks> b, store_.blocks(name));
    if (!b) return std::optional<RawMatrix>();
    into.names.push_back(name);
    return std::optional<RawMatrix>(blocks_of(*b));
  }
  bool file_blocks() const { return type_ != kernels::WeightType::kF32 && type_ == store_.block_type(); }
  // An owned copy of a tensor; its pages in the mapping are dropped.
  Result<Tensor> owned(const std::string& name) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, get(name));
    Tensor out = t.clone();
    store_.release(name);
    return out;
  }
  Result<Tensor> owned_base(const std::string& leaf) { return owned(p_ + leaf); }
  // A Linear-layout matrix, packed (with `quantize`, in the load's type);
  // its pages in the mapping are dropped.
  Result<kernels::PackedLinear> packed(const std::string& name, bool quantize = false) {
    if (quantize && file_blocks()) {
      TESSERA_ASSIGN_OR_RETURN(std::optional<TensorStore::Blocks> b, store_.blocks(name));
      if (b) {
        const RawMatrix m = blocks_of(*b);
        kernels::PackedLinear w = pack(m, {}, type_);
        store_.release(name);
        return w;
      }
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor t, get(name));
    TESSERA_CHECK(t.rank() == 2);
    const kernels::WeightSource src{t.f32(), t.dim(0), t.dim(1), 1};
    kernels::PackedLinear w = kernels::PackedLinear::pack(std::span<const kernels::WeightSource>(&src, 1), t.dim(1),
                                                          kernels::gemm_path(), consumed(),
                                                          quantize ? type_ : kernels::WeightType::kF32);
    store_.release(name);
    return w;
  }
  void release(const std::vector<std::string>& names) {
    for (const auto& n : names) store_.release(n);
  }
  // Drops the pages of what packing has read, as it goes.
  kernels::PackedLinear::Consumed consumed() {
    return [this](const void* p, size_t bytes) { store_.release_bytes(p, bytes); };
  }

  // Layer l, or its sub-block under `sub` (residual width F).
  Result<RawLayer> load_layer(int64_t l, const std::string& sub = "", int64_t F = -1);
  Result<RawLayer> load_llama_layer(int64_t l);

 private:
  const TensorStore& store_;
  const ModelConfig& c_;
  std::string p_;
  kernels::WeightType type_ = kernels::WeightType::kF32;
};

// Q, K, V stacked in one matrix (and their biases, when the model has
// them); gate and up stacked as the MLP's input matrix.
Result<RawLayer> Loader::load_llama_layer(int64_t l) {
  RawLayer w;
  const LayerNames& n = names_of(c_).layer;
  auto matrices = [&](const std::vector<std::string>& ws, const std::vector<std::string>& bs, bool biased,
                      Tensor* bias) -> Result<RawMatrix> {
    std::vector<RawMatrix> ms;
    std::vector<Tensor> bt;
    for (size_t i = 0; i < ws.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(RawMatrix m, linear(l, ws[i], w));
      ms.push_back(std::move(m));
      if (biased) {
        TESSERA_ASSIGN_OR_RETURN(Tensor b, layer(l, bs[i], w));
        bt.push_back(b);
      }
    }
    if (biased) *bias = bt.size() == 1 ? bt[0] : concat_rows(bt);
    return ms.size() == 1 ? std::move(ms[0]) : stack(ms, c_.hidden);
  };
  TESSERA_ASSIGN_OR_RETURN(w.qkv, matrices(n.qkv_w, n.qkv_b, c_.attention_bias, &w.qkv_b));
  TESSERA_ASSIGN_OR_RETURN(w.attn_out, matrices({n.attn_out_w}, {n.attn_out_b}, c_.o_bias, &w.attn_out_b));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in, matrices(n.ffn_in_w, n.ffn_in_b, c_.mlp_bias, &w.ffn_in_b));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out, matrices({n.ffn_out_w}, {n.ffn_out_b}, c_.mlp_bias, &w.ffn_out_b));
  TESSERA_ASSIGN_OR_RETURN(w.ln1_g, layer(l, n.ln1_g, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_g, layer(l, n.ln2_g, w));
  if (c_.qk_norm) {
    TESSERA_ASSIGN_OR_RETURN(w.q_norm, layer(l, n.q_norm, w));
    TESSERA_ASSIGN_OR_RETURN(w.k_norm, layer(l, n.k_norm, w));
  }
  return w;
}

Result<RawLayer> Loader::load_layer(int64_t l, const std::string& sub, int64_t F) {
  if (c_.llama_style()) return load_llama_layer(l);
  const LayerNames& n = names_of(c_).layer;
  RawLayer w;
  auto layer = [&](int64_t li, const std::string& leaf, RawLayer& into) { return this->layer(li, sub + leaf, into); };
  auto matrix = [&](const std::string& leaf) -> Result<RawMatrix> {
    TESSERA_ASSIGN_OR_RETURN(std::optional<RawMatrix> b, file_matrix(l, sub + leaf, w));
    if (b) return std::move(*b);
    TESSERA_ASSIGN_OR_RETURN(Tensor t, layer(l, leaf, w));
    return n.conv1d ? conv1d_of(t) : linear_of(t);
  };
  std::vector<RawMatrix> ws;
  std::vector<Tensor> bs;
  for (size_t i = 0; i < n.qkv_w.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(RawMatrix m, matrix(n.qkv_w[i]));
    ws.push_back(std::move(m));
    if (n.conv1d || c_.qkv_bias) {
      TESSERA_ASSIGN_OR_RETURN(Tensor bt, layer(l, n.qkv_b[i], w));
      bs.push_back(bt);
    } else {
      bs.push_back(Tensor::zeros_f32({c_.hidden}));  // ViT without Q/K/V biases
    }
  }
  w.qkv = ws.size() == 1 ? std::move(ws[0]) : stack(ws, F < 0 ? c_.hidden : F);
  w.qkv_b = bs.size() == 1 ? bs[0] : concat_rows(bs);
  TESSERA_ASSIGN_OR_RETURN(w.attn_out, matrix(n.attn_out_w));
  TESSERA_ASSIGN_OR_RETURN(w.attn_out_b, layer(l, n.attn_out_b, w));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in, matrix(n.ffn_in_w[0]));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in_b, layer(l, n.ffn_in_b[0], w));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out, matrix(n.ffn_out_w));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out_b, layer(l, n.ffn_out_b, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln1_g, layer(l, n.ln1_g, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln1_b, layer(l, n.ln1_b, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_g, layer(l, n.ln2_g, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_b, layer(l, n.ln2_b, w));
  return w;
}

core::Status validate_names(const TensorStore& store, const std::vector<Entry>& entries) {
  std::set<std::string> known;
  for (const auto& e : entries) {
    known.insert(e.name);
    const TensorInfo* info = store.info(e.name);
    if (info == nullptr) {
      if (e.required) return core::not_found("missing tensor '" + e.name + "'");
      continue;
    }
    if (info->shape != e.shape)
      return core::invalid_argument("tensor '" + e.name + "' has shape " + core::shape_to_string(info->shape) +
                                    ", expected " + core::shape_to_string(e.shape));
    if (info->dtype != core::DType::kF32 && info->dtype != core::DType::kF16 && info->dtype != core::DType::kBF16)
      return core::invalid_argument("tensor '" + e.name + "' has dtype " + core::dtype_name(info->dtype) +
                                    "; expected F32, F16 or BF16");
  }
  for (const auto& n : store.names())
    if (!known.count(n) && !ignorable(n)) return core::invalid_argument("unexpected tensor '" + n + "' in the checkpoint");
  return core::ok_status();
}

// Config files without "architectures": infer the head from the tensors.
void infer_head(ModelConfig& c, const TensorStore& store, const std::string& prefix) {
  if (!c.architecture.empty()) return;
  if (c.causal()) {
    c.head = prefix.empty() ? HeadKind::kNone : HeadKind::kLmHead;
  } else if (store.contains(names_of(c).base.classifier_w)) {
    c.head = c.takes_images() ? HeadKind::kImageClassification : HeadKind::kSequenceClassification;
    const TensorInfo* info = store.info(names_of(c).base.classifier_w);
    if (info->shape.size() == 2 && c.num_labels() != info->shape[0]) {
      c.labels.clear();
      for (int64_t i = 0; i < info->shape[0]; ++i) c.labels.push_back("LABEL_" + std::to_string(i));
    }
  }
}


}  // namespace

LayerWeights shard_layer(const LayerWeights& full, int64_t F, int64_t hd, int64_t h0, int64_t h1, int64_t c0, int64_t c1) {
  // From the packed layer: unpack, cut, pack again (tests and tools; loading
  // cuts the file's tensors before packing, see load_weights).
  RawLayer r;
  r.qkv = linear_of(full.qkv_w.unpack());
  r.attn_out = linear_of(full.attn_out_w.unpack());
  r.ffn_in = linear_of(full.ffn_in_w.unpack());
  r.ffn_out = linear_of(full.ffn_out_w.unpack());
  r.qkv_b = full.qkv_b; r.attn_out_b = full.attn_out_b; r.ffn_in_b = full.ffn_in_b; r.ffn_out_b = full.ffn_out_b;
  r.ln1_g = full.ln1_g; r.ln1_b = full.ln1_b; r.ln2_g = full.ln2_g; r.ln2_b = full.ln2_b;
  return finish_layer(shard_raw(r, {F, F, F, r.ffn_out.k, false}, {h0, h1, h0, h1, hd}, c0, c1), {}, full.qkv_w.type(),
                      r.attn_out.k, r.ffn_out.k);
}

size_t LayerWeights::bytes() const {
  size_t b = 0;
  for (const LayerWeights& s : blocks) b += s.bytes();
  for (const Tensor* t : {&qkv_b, &attn_out_b, &ln1_g, &ln1_b, &ffn_in_b, &ffn_out_b, &ln2_g, &ln2_b, &q_norm, &k_norm})
    b += t->empty() ? 0 : t->nbytes();
  for (const kernels::PackedLinear* m : {&qkv_w, &attn_out_w, &ffn_in_w, &ffn_out_w}) b += m->nbytes();
  return b;
}

size_t ModelWeights::bytes() const {
  size_t b = 0;
  for (const Tensor* t : {&word_emb, &pos_emb, &type_emb, &emb_ln_g, &emb_ln_b, &patch_b, &cls_token, &final_ln_g,
                          &final_ln_b, &pooler_b, &classifier_b})
    b += t->empty() ? 0 : t->nbytes();
  for (const kernels::PackedLinear* m : {&patch_w, &pooler_w, &classifier_w, &lm_head_w, &project_in_w, &project_out_w})
    b += m->nbytes();
  for (const auto& l : layers) b += l.bytes();
  return b;
}

void ModelWeights::word_row(int64_t id, float* dst) const {
  if (!word_emb.empty()) {
    TESSERA_CHECK(id >= 0 && id < word_emb.dim(0));
    std::memcpy(dst, word_emb.f32() + id * word_emb.dim(1), static_cast<size_t>(word_emb.dim(1)) * sizeof(float));
    return;
  }
  TESSERA_CHECK_MSG(!lm_head_w.empty(), "word embeddings are not loaded on this device");
  lm_head_w.copy_row(id, dst);  // the tied wte, read from its panel with stride
}

std::string hf_prefix(const ModelConfig& c) {
  if (c.head == HeadKind::kNone) return "";
  return names_of(c).wrapper;
}

std::vector<NamedShape> hf_tensor_table(const ModelConfig& c) {
  std::vector<NamedShape> out;
  for (const auto& e : entries_for(c, hf_prefix(c))) {
    if (!e.required) {
      // Optional tensors gen-model writes: the BERT/ViT-model pooler.
      const bool pooler = e.name.find("pooler.") != std::string::npos;
      if (!pooler || c.head != HeadKind::kNone) continue;
    }
    out.push_back({e.name, e.shape});
  }
  return out;
}

namespace {

// The layers to load: opts.only_layers, or [layer_begin, layer_end).
Result<std::vector<int64_t>> layers_to_load(const ModelConfig& c, const LoadOptions& opts) {
  const int64_t end = opts.layer_end < 0 ? c.layers : opts.layer_end;
  if (opts.layer_begin < 0 || opts.layer_begin > end || end > c.layers)
    return core::out_of_range("layer range [" + std::to_string(opts.layer_begin) + "," + std::to_string(end) +
                              ") outside the model's " + std::to_string(c.layers) + " layers");
  std::vector<int64_t> layers = opts.only_layers;
  if (layers.empty())
    for (int64_t l = opts.layer_begin; l < end; ++l) layers.push_back(l);
  return layers;
}

// The tensor-parallel shard of the original layers: heads [h0, h1) and FFN
// columns [f0, f1), and whether that is less than the whole layer.
struct Shard {
  int64_t h0 = 0, h1 = 0, f0 = 0, f1 = 0;
  bool cut = false;
};

Result<Shard> shard_of(const ModelConfig& c, const LoadOptions& opts) {
  Shard s;
  s.h0 = opts.head_begin;
  s.f0 = opts.ffn_begin;
  s.h1 = opts.head_end < 0 ? c.heads : opts.head_end;
  s.f1 = opts.ffn_end < 0 ? c.intermediate : opts.ffn_end;
  if (s.h0 < 0 || s.h0 > s.h1 || s.h1 > c.heads || s.f0 < 0 || s.f0 > s.f1 || s.f1 > c.intermediate)
    return core::out_of_range("tensor-parallel shard outside the model's heads or FFN columns");
  s.cut = s.h0 > 0 || s.h1 < c.heads || s.f0 > 0 || s.f1 < c.intermediate;
  return s;
}

// The input side, as entries_for lists it: token rows (with a tied head,
// one packed matrix serves the lookup and the head), positions, token types,
// their norm and projection; or an image's class token, positions and patch
// projection.
core::Status load_embeddings(Loader& ld, const TensorStore& store, const ModelConfig& c, const std::string& prefix,
                             bool tied_packed, ModelWeights& w) {
  const BaseNames& b = names_of(c).base;
  if (c.takes_images()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor cls, ld.owned_base(b.cls));
    w.cls_token = cls.reshaped({c.hidden});
    TESSERA_ASSIGN_OR_RETURN(Tensor pos, ld.owned_base(b.pos));
    w.pos_emb = pos.reshaped({c.max_rows(), c.hidden});
    TESSERA_ASSIGN_OR_RETURN(Tensor pw, ld.base(b.patch_w));
    w.patch_w = kernels::PackedLinear::pack(pw.reshaped({c.hidden, c.channels * c.patch_size * c.patch_size}));
    store.release(prefix + b.patch_w);
    TESSERA_ASSIGN_OR_RETURN(w.patch_b, ld.owned_base(b.patch_b));
    return core::ok_status();
  }
  if (tied_packed) {
    TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(prefix + b.word, true));
  } else {
    TESSERA_ASSIGN_OR_RETURN(w.word_emb, ld.owned_base(b.word));
  }
  if (c.learned_positions) {
    TESSERA_ASSIGN_OR_RETURN(w.pos_emb, ld.owned_base(b.pos));
  }
  if (c.has_token_types()) {
    TESSERA_ASSIGN_OR_RETURN(w.type_emb, ld.owned_base(b.type));
  }
  if (c.embed_norm) {
    TESSERA_ASSIGN_OR_RETURN(w.emb_ln_g, ld.owned_base(b.emb_ln_g));
    TESSERA_ASSIGN_OR_RETURN(w.emb_ln_b, ld.owned_base(b.emb_ln_b));
  }
  if (c.projects_embeddings()) {
    TESSERA_ASSIGN_OR_RETURN(w.project_in_w, ld.packed(prefix + b.project_in, true));
  }
  return core::ok_status();
}

// The output side: the final norm, the projection back to the token width
// and the LM head (tied: the packed token table, unless the embeddings
// brought it already); or the pooler where the checkpoint has one, and the
// classifier.
core::Status load_head(Loader& ld, const TensorStore& store, const ModelConfig& c, const std::string& prefix,
                       bool tied_packed, ModelWeights& w) {
  const BaseNames& b = names_of(c).base;
  if (c.final_norm) {
    TESSERA_ASSIGN_OR_RETURN(w.final_ln_g, ld.owned_base(b.final_ln_g));
    if (!c.llama_style()) {
      TESSERA_ASSIGN_OR_RETURN(w.final_ln_b, ld.owned_base(b.final_ln_b));
    }
  }
  if (c.causal()) {
    if (c.projects_embeddings()) {
      TESSERA_ASSIGN_OR_RETURN(w.project_out_w, ld.packed(prefix + b.project_out, true));
    }
    if (c.head == HeadKind::kLmHead) {
      if (!tied_packed) {
        TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(b.lm_head, true));
      } else if (w.lm_head_w.empty()) {
        TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(prefix + b.word, true));  // tied
      }
    }
    return core::ok_status();
  }
  if (store.contains(prefix + b.pooler_w)) {
    TESSERA_ASSIGN_OR_RETURN(w.pooler_w, ld.packed(prefix + b.pooler_w));
    TESSERA_ASSIGN_OR_RETURN(w.pooler_b, ld.owned_base(b.pooler_b));
  }
  if (c.head != HeadKind::kNone) {
    TESSERA_ASSIGN_OR_RETURN(w.classifier_w, ld.packed(b.classifier_w));
    TESSERA_ASSIGN_OR_RETURN(w.classifier_b, ld.owned(b.classifier_b));
  }
  return core::ok_status();
}

// A decoupled layer: its sub-blocks [block_begin, block_end), each packed
// and its file pages dropped before the next is read.
core::Status load_sub_blocks(Loader& ld, const ModelConfig& c, const LoadOptions& opts, int64_t l, LayerWeights& dst) {
  const int64_t b1 = opts.block_end < 0 ? c.bp_div : opts.block_end;
  if (opts.block_begin < 0 || opts.block_begin > b1 || b1 > c.bp_div)
    return core::out_of_range("sub-block range outside the model's " + std::to_string(c.bp_div) + " sub-blocks");
  dst.blocks.resize(static_cast<size_t>(c.bp_div));
  for (int64_t i = opts.block_begin; i < b1; ++i) {
    auto bw = ld.load_layer(l, block_prefix(i), c.block_width());
    if (!bw.ok()) return bw.status();
    dst.blocks[static_cast<size_t>(i)] = finish_layer(*bw, ld.consumed(), ld.type(), bw->attn_out.k, bw->ffn_out.k);
    ld.release(bw->names);
  }
  return core::ok_status();
}

// An original layer, whole or its TP shard, and with `part` (1: attention,
// 2: MLP, 3: both) only the blocks this device runs.
core::Status load_original_layer(Loader& ld, const ModelConfig& c, const Shard& s, int64_t l, int part,
                                 LayerWeights& dst) {
  auto lw = ld.load_layer(l);
  if (!lw.ok()) return lw.status();
  // TP shards cut the file's tensors first and pack only their slice.
  dst = finish_layer(s.cut ? shard_raw(*lw, dims_of(c), c.head_shard(s.h0, s.h1), s.f0, s.f1) : *lw, ld.consumed(),
                     ld.type(), lw->attn_out.k, lw->ffn_out.k);
  ld.release(lw->names);
  // A block alone: the other block's matrices go after packing (the peak
  // holds one extra block of one layer for a moment).
  if (part < 1 || part > 3) return core::invalid_argument("only_parts entries are 1, 2 or 3");
  if ((part & 1) == 0) dst.qkv_w = {}, dst.attn_out_w = {};
  if ((part & 2) == 0) dst.ffn_in_w = {}, dst.ffn_out_w = {};
  return core::ok_status();
}

}  // namespace

Result<ModelWeights> load_weights(const TensorStore& store, ModelConfig& c, const LoadOptions& opts) {
  const std::string prefix = detect_prefix(c, store);
  infer_head(c, store, prefix);
  TESSERA_RETURN_IF_ERROR(validate_names(store, entries_for(c, prefix)));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<int64_t> layers, layers_to_load(c, opts));
  TESSERA_ASSIGN_OR_RETURN(const Shard shard, shard_of(c, opts));
  // What this device holds (shard maths reads it): the load's type, or the
  // file's own (a quantized GGUF) when the load asks for none.
  if (opts.weights != kernels::WeightType::kF32) c.weights = opts.weights;
  if (c.weights != kernels::WeightType::kF32 && c.bp_div > 0)
    return core::unimplemented("a decoupled model (block_parallel) does not load quantized weights yet");
  Loader ld(store, c, prefix, c.weights);
  ModelWeights w;
  // Embeddings and head first, while few pages are resident: copying the big
  // word embeddings last would add their size to the peak.
  // GPT-2 and tied Llama-style heads: one packed matrix serves the lookup
  // and the head (a tied checkpoint that still stores lm_head reads it).
  const bool tied_packed = c.causal() && !store.contains(names_of(c).base.lm_head);
  if (opts.embeddings || opts.head) TESSERA_RETURN_IF_ERROR(load_embeddings(ld, store, c, prefix, tied_packed, w));
  if (opts.head) TESSERA_RETURN_IF_ERROR(load_head(ld, store, c, prefix, tied_packed, w));
  if (!opts.only_parts.empty() && opts.only_parts.size() != opts.only_layers.size())
    return core::invalid_argument("only_parts needs one entry per layer of only_layers");
  w.layers.resize(static_cast<size_t>(c.layers));
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t l = layers[i];
    if (l < 0 || l >= c.layers) return core::out_of_range("layer " + std::to_string(l) + " outside the model");
    LayerWeights& dst = w.layers[static_cast<size_t>(l)];
    if (c.decoupled(l)) {
      TESSERA_RETURN_IF_ERROR(load_sub_blocks(ld, c, opts, l, dst));
    } else {
      const int part = opts.only_parts.empty() ? 3 : opts.only_parts[i];
      TESSERA_RETURN_IF_ERROR(load_original_layer(ld, c, shard, l, part, dst));
    }
  }
  return w;
}

}  // namespace tessera::model
