#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/check.h"
#include "model/arch/opt.h"

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

std::string layer_name(const ModelConfig& c, int64_t l, const std::string& leaf) {
  const std::string i = std::to_string(l);
  if (c.llama_style()) return "layers." + i + "." + leaf;
  if (c.family == Family::kOpt) return "decoder.layers." + i + "." + leaf;
  return (c.family == Family::kGpt2 ? "h." + i + "." : "encoder.layer." + i + ".") + leaf;
}

// One table per architecture: the Hugging Face leaf name of each tensor of a
// layer, by role. add_layer_entries (what a checkpoint must hold, and what
// gen-model writes) and Loader::load_layer both read it, so a name is written
// once.
struct LayerNames {
  bool conv1d = false;  // GPT-2: Conv1D matrices [in, out], Q|K|V fused in one
  std::vector<std::string> qkv_w, qkv_b;  // one fused tensor, or query, key, value
  std::string attn_out_w, attn_out_b, ffn_in_w, ffn_in_b, ffn_out_w, ffn_out_b;
  std::string ln1_g, ln1_b, ln2_g, ln2_b;
};

const LayerNames& layer_names(Family f) {
  static const LayerNames gpt2{true,
                               {"attn.c_attn.weight"},
                               {"attn.c_attn.bias"},
                               "attn.c_proj.weight",
                               "attn.c_proj.bias",
                               "mlp.c_fc.weight",
                               "mlp.c_fc.bias",
                               "mlp.c_proj.weight",
                               "mlp.c_proj.bias",
                               "ln_1.weight",
                               "ln_1.bias",
                               "ln_2.weight",
                               "ln_2.bias"};
  auto encoder = [](const std::string& self, const std::string& ln1, const std::string& ln2) {
    LayerNames n;
    for (const char* x : {"query", "key", "value"}) {
      n.qkv_w.push_back(self + x + ".weight");
      n.qkv_b.push_back(self + x + ".bias");
    }
    n.attn_out_w = "attention.output.dense.weight";
    n.attn_out_b = "attention.output.dense.bias";
    n.ffn_in_w = "intermediate.dense.weight";
    n.ffn_in_b = "intermediate.dense.bias";
    n.ffn_out_w = "output.dense.weight";
    n.ffn_out_b = "output.dense.bias";
    n.ln1_g = ln1 + ".weight";
    n.ln1_b = ln1 + ".bias";
    n.ln2_g = ln2 + ".weight";
    n.ln2_b = ln2 + ".bias";
    return n;
  };
  static const LayerNames bert = encoder("attention.self.", "attention.output.LayerNorm", "output.LayerNorm");
  static const LayerNames vit = encoder("attention.attention.", "layernorm_before", "layernorm_after");
  static const LayerNames opt = [] {
    LayerNames n;
    for (const char* x : {"q_proj", "k_proj", "v_proj"}) {
      n.qkv_w.push_back(std::string("self_attn.") + x + ".weight");
      n.qkv_b.push_back(std::string("self_attn.") + x + ".bias");
    }
    n.attn_out_w = "self_attn.out_proj.weight";
    n.attn_out_b = "self_attn.out_proj.bias";
    n.ffn_in_w = "fc1.weight";
    n.ffn_in_b = "fc1.bias";
    n.ffn_out_w = "fc2.weight";
    n.ffn_out_b = "fc2.bias";
    n.ln1_g = "self_attn_layer_norm.weight";  // before attention (pre-LN) or after it (post-LN)
    n.ln1_b = "self_attn_layer_norm.bias";
    n.ln2_g = "final_layer_norm.weight";
    n.ln2_b = "final_layer_norm.bias";
    return n;
  }();
  return f == Family::kGpt2 ? gpt2 : f == Family::kBert ? bert : f == Family::kOpt ? opt : vit;
}

// A Llama-style layer's tensors ([out, in]), by role.
struct LlamaNames {
  std::vector<std::string> qkv = {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."};
  std::string o = "self_attn.o_proj.", q_norm = "self_attn.q_norm.weight", k_norm = "self_attn.k_norm.weight";
  std::string ln1 = "input_layernorm.weight", ln2 = "post_attention_layernorm.weight";
  std::vector<std::string> gate_up = {"mlp.gate_proj.", "mlp.up_proj."};
  std::string down = "mlp.down_proj.";
};
const LlamaNames kLlama;

void add_llama_entries(const ModelConfig& c, int64_t l, const std::string& p, std::vector<Entry>* out) {
  const int64_t F = c.hidden, I = c.intermediate, d = c.head_dim();
  auto add = [&](const std::string& leaf, Shape s) { out->push_back({p + layer_name(c, l, leaf), s, true}); };
  add(kLlama.ln1, {F});
  const int64_t rows[3] = {c.q_width(), c.kv_width(), c.kv_width()};
  for (int i = 0; i < 3; ++i) {
    add(kLlama.qkv[static_cast<size_t>(i)] + "weight", {rows[i], F});
    if (c.attention_bias) add(kLlama.qkv[static_cast<size_t>(i)] + "bias", {rows[i]});
  }
  add(kLlama.o + "weight", {F, c.q_width()});
  if (c.o_bias) add(kLlama.o + "bias", {F});
  if (c.qk_norm) {
    add(kLlama.q_norm, {d});
    add(kLlama.k_norm, {d});
  }
  add(kLlama.ln2, {F});
  for (const auto& g : kLlama.gate_up) {
    add(g + "weight", {I, F});
    if (c.mlp_bias) add(g + "bias", {I});
  }
  add(kLlama.down + "weight", {F, I});
  if (c.mlp_bias) add(kLlama.down + "bias", {F});
}

// The tensors of one ordinary layer, or of one sub-block (`sub` =
// "blocks.{i}.", residual width F = h/N) of a decoupled layer.
void add_block_entries(const ModelConfig& c, int64_t l, const std::string& sub, int64_t F, const std::string& p,
                       std::vector<Entry>* out) {
  const int64_t H = c.hidden, I = c.intermediate;  // attention and FFN widths stay whole
  const LayerNames& n = layer_names(c.family);
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
    add(n.ffn_in_w, {F, I});
    add(n.ffn_in_b, {I});
    add(n.ffn_out_w, {I, F});
    add(n.ffn_out_b, {F});
    return;
  }
  for (size_t i = 0; i < n.qkv_w.size(); ++i) {  // [out, in]
    add(n.qkv_w[i], {H, F});
    add(n.qkv_b[i], {H}, c.family == Family::kBert || c.qkv_bias);
  }
  add(n.attn_out_w, {F, H});
  add(n.attn_out_b, {F});
  add(n.ffn_in_w, {I, F});
  add(n.ffn_in_b, {I});
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

// The tensors around the layers, one table per architecture like
// layer_names: entries_for and load_weights both read it.
struct BaseNames {
  std::string word, pos, type, emb_ln_g, emb_ln_b;  // BERT; GPT-2: word, pos
  std::string cls, patch_w, patch_b;                // ViT
  std::string final_ln_g, final_ln_b;               // GPT-2's ln_f, ViT's layernorm
  std::string project_in, project_out;              // OPT
  std::string pooler_w = "pooler.dense.weight", pooler_b = "pooler.dense.bias";
  std::string lm_head = "lm_head.weight", classifier_w = "classifier.weight", classifier_b = "classifier.bias";
};

const BaseNames& base_names(Family f) {
  static const BaseNames bert = [] {
    BaseNames b;
    b.word = "embeddings.word_embeddings.weight";
    b.pos = "embeddings.position_embeddings.weight";
    b.type = "embeddings.token_type_embeddings.weight";
    b.emb_ln_g = "embeddings.LayerNorm.weight";
    b.emb_ln_b = "embeddings.LayerNorm.bias";
    return b;
  }();
  static const BaseNames gpt2 = [] {
    BaseNames b;
    b.word = "wte.weight";
    b.pos = "wpe.weight";
    b.final_ln_g = "ln_f.weight";
    b.final_ln_b = "ln_f.bias";
    return b;
  }();
  static const BaseNames vit = [] {
    BaseNames b;
    b.cls = "embeddings.cls_token";
    b.pos = "embeddings.position_embeddings";
    b.patch_w = "embeddings.patch_embeddings.projection.weight";
    b.patch_b = "embeddings.patch_embeddings.projection.bias";
    b.final_ln_g = "layernorm.weight";
    b.final_ln_b = "layernorm.bias";
    return b;
  }();
  static const BaseNames llama = [] {
    BaseNames b;
    b.word = "embed_tokens.weight";
    b.final_ln_g = "norm.weight";
    return b;
  }();
  static const BaseNames opt = [] {
    BaseNames b;
    b.word = "decoder.embed_tokens.weight";
    b.pos = "decoder.embed_positions.weight";
    b.final_ln_g = "decoder.final_layer_norm.weight";
    b.final_ln_b = "decoder.final_layer_norm.bias";
    b.project_in = "decoder.project_in.weight";
    b.project_out = "decoder.project_out.weight";
    return b;
  }();
  return f == Family::kGpt2 ? gpt2 : f == Family::kBert ? bert : f == Family::kLlama ? llama : f == Family::kOpt ? opt : vit;
}

std::vector<Entry> entries_for(const ModelConfig& c, const std::string& p) {
  const int64_t F = c.hidden;
  const BaseNames& b = base_names(c.family);
  std::vector<Entry> e;
  const bool has_head = c.head != HeadKind::kNone;
  if (c.family == Family::kBert) {
    e.push_back({p + b.word, {c.vocab, F}});
    e.push_back({p + b.pos, {c.max_positions, F}});
    e.push_back({p + b.type, {c.type_vocab, F}});
    e.push_back({p + b.emb_ln_g, {F}});
    e.push_back({p + b.emb_ln_b, {F}});
  } else if (c.family == Family::kGpt2) {
    e.push_back({p + b.word, {c.vocab, F}});
    e.push_back({p + b.pos, {c.max_positions, F}});
  } else if (c.llama_style()) {
    e.push_back({p + b.word, {c.vocab, F}});
  } else if (c.family == Family::kOpt) {
    e.push_back({p + b.word, {c.vocab, c.token_width()}});
    e.push_back({p + b.pos, {c.max_positions + arch::kOptPositionOffset, F}});
    if (c.projects_embeddings()) e.push_back({p + b.project_in, {F, c.token_width()}});
  } else {
    const int64_t ps = c.patch_size;
    e.push_back({p + b.cls, {1, 1, F}});
    e.push_back({p + b.pos, {1, c.max_rows(), F}});
    e.push_back({p + b.patch_w, {F, c.channels, ps, ps}});
    e.push_back({p + b.patch_b, {F}});
  }
  for (int64_t l = 0; l < c.layers; ++l) add_layer_entries(c, l, p, &e);
  if (c.family == Family::kOpt) {
    if (c.final_norm) {
      e.push_back({p + b.final_ln_g, {F}});
      e.push_back({p + b.final_ln_b, {F}});
    }
    if (c.projects_embeddings()) e.push_back({p + b.project_out, {c.token_width(), F}});
    if (c.head == HeadKind::kLmHead) e.push_back({b.lm_head, {c.vocab, c.token_width()}, !c.tied_head});
    return e;
  }
  if (c.llama_style()) {
    e.push_back({p + b.final_ln_g, {F}});
    // A tied head reads the embeddings; a checkpoint may still store it.
    if (c.head == HeadKind::kLmHead) e.push_back({b.lm_head, {c.vocab, F}, !c.tied_head});
    return e;
  }
  if (c.family == Family::kGpt2) {
    e.push_back({p + b.final_ln_g, {F}});
    e.push_back({p + b.final_ln_b, {F}});
    if (c.head == HeadKind::kLmHead) e.push_back({b.lm_head, {c.vocab, F}, false});
  } else {
    if (c.family == Family::kVit) {
      e.push_back({p + b.final_ln_g, {F}});
      e.push_back({p + b.final_ln_b, {F}});
    }
    // BERT's classifier reads the pooler; otherwise the pooler is optional.
    const bool pooler_required = c.head == HeadKind::kSequenceClassification;
    e.push_back({p + b.pooler_w, {F, F}, pooler_required});
    e.push_back({p + b.pooler_b, {F}, pooler_required});
    if (has_head) {
      e.push_back({b.classifier_w, {c.num_labels(), F}});
      e.push_back({b.classifier_b, {c.num_labels()}});
    }
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

std::string hf_wrapper(Family f) {
  switch (f) {
    case Family::kGpt2: return "transformer.";
    case Family::kBert: return "bert.";
    case Family::kVit: return "vit.";
    case Family::kLlama: return "model.";
    case Family::kOpt: return "model.";
  }
  return "";
}

std::string detect_prefix(const ModelConfig& c, const TensorStore& store) {
  const BaseNames& b = base_names(c.family);
  const std::string probe = c.family == Family::kVit ? b.cls : b.word;
  return store.contains(hf_wrapper(c.family) + probe) ? hf_wrapper(c.family) : "";
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
};

RawMatrix linear_of(const Tensor& t) {  // Linear [out, in]
  return {{t}, {{t.f32(), t.dim(0), t.dim(1), 1}}, t.dim(1)};
}

RawMatrix conv1d_of(const Tensor& t) {  // GPT-2 Conv1D [in, out]: a row is a column
  return {{t}, {{t.f32(), t.dim(1), 1, t.dim(1)}}, t.dim(0)};
}

// Rows [r0, r1) of the stacked parts.
RawMatrix rows_of(const RawMatrix& m, int64_t r0, int64_t r1) {
  RawMatrix out{m.held, {}, m.k};
  int64_t at = 0;
  for (const auto& s : m.parts) {
    const int64_t b = std::max(r0, at), e = std::min(r1, at + s.rows);
    if (b < e) out.parts.push_back({s.data + (b - at) * s.row_stride, e - b, s.row_stride, s.col_stride});
    at += s.rows;
  }
  return out;
}

// Columns [c0, c1).
RawMatrix cols_of(const RawMatrix& m, int64_t c0, int64_t c1) {
  RawMatrix out{m.held, {}, c1 - c0};
  for (const auto& s : m.parts) out.parts.push_back({s.data + c0 * s.col_stride, s.rows, s.row_stride, s.col_stride});
  return out;
}

RawMatrix stack(const std::vector<RawMatrix>& ms, int64_t k) {
  RawMatrix out{{}, {}, k};
  for (const auto& m : ms) {
    out.held.insert(out.held.end(), m.held.begin(), m.held.end());
    out.parts.insert(out.parts.end(), m.parts.begin(), m.parts.end());
  }
  return out;
}

kernels::PackedLinear pack(const RawMatrix& m, const kernels::PackedLinear::Consumed& consumed = {}) {
  return kernels::PackedLinear::pack(m.parts, m.k, kernels::gemm_path(), consumed);
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

LayerWeights finish_layer(const RawLayer& r, const kernels::PackedLinear::Consumed& consumed = {}) {
  LayerWeights w;
  w.qkv_w = pack(r.qkv, consumed);
  w.attn_out_w = pack(r.attn_out, consumed);
  w.ffn_in_w = pack(r.ffn_in, consumed);
  w.ffn_out_w = pack(r.ffn_out, consumed);
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
  Loader(const TensorStore& store, const ModelConfig& c, std::string prefix)
      : store_(store), c_(c), p_(std::move(prefix)) {}

  Result<Tensor> get(const std::string& name) { return store_.get_f32(name); }
  Result<Tensor> base(const std::string& leaf) { return get(p_ + leaf); }
  Result<Tensor> layer(int64_t l, const std::string& leaf, RawLayer& into) {
    into.names.push_back(p_ + layer_name(c_, l, leaf));
    return get(into.names.back());
  }
  // An owned copy of a tensor; its pages in the mapping are dropped.
  Result<Tensor> owned(const std::string& name) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, get(name));
    Tensor out = t.clone();
    store_.release(name);
    return out;
  }
  Result<Tensor> owned_base(const std::string& leaf) { return owned(p_ + leaf); }
  // A Linear-layout matrix, packed; its pages in the mapping are dropped.
  Result<kernels::PackedLinear> packed(const std::string& name) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, get(name));
    TESSERA_CHECK(t.rank() == 2);
    const kernels::WeightSource src{t.f32(), t.dim(0), t.dim(1), 1};
    kernels::PackedLinear w = kernels::PackedLinear::pack(std::span<const kernels::WeightSource>(&src, 1), t.dim(1),
                                                          kernels::gemm_path(), consumed());
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
};

// Q, K, V stacked in one matrix (and their biases, when the model has
// them); gate and up stacked as the MLP's input matrix.
Result<RawLayer> Loader::load_llama_layer(int64_t l) {
  RawLayer w;
  auto matrices = [&](const std::vector<std::string>& leaves, bool biased, Tensor* bias) -> Result<RawMatrix> {
    std::vector<RawMatrix> ms;
    std::vector<Tensor> bs;
    for (const auto& leaf : leaves) {
      TESSERA_ASSIGN_OR_RETURN(Tensor t, layer(l, leaf + "weight", w));
      ms.push_back(linear_of(t));
      if (biased) {
        TESSERA_ASSIGN_OR_RETURN(Tensor b, layer(l, leaf + "bias", w));
        bs.push_back(b);
      }
    }
    if (biased) *bias = bs.size() == 1 ? bs[0] : concat_rows(bs);
    return ms.size() == 1 ? std::move(ms[0]) : stack(ms, c_.hidden);
  };
  TESSERA_ASSIGN_OR_RETURN(w.qkv, matrices(kLlama.qkv, c_.attention_bias, &w.qkv_b));
  TESSERA_ASSIGN_OR_RETURN(w.attn_out, matrices({kLlama.o}, c_.o_bias, &w.attn_out_b));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in, matrices(kLlama.gate_up, c_.mlp_bias, &w.ffn_in_b));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out, matrices({kLlama.down}, c_.mlp_bias, &w.ffn_out_b));
  TESSERA_ASSIGN_OR_RETURN(w.ln1_g, layer(l, kLlama.ln1, w));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_g, layer(l, kLlama.ln2, w));
  if (c_.qk_norm) {
    TESSERA_ASSIGN_OR_RETURN(w.q_norm, layer(l, kLlama.q_norm, w));
    TESSERA_ASSIGN_OR_RETURN(w.k_norm, layer(l, kLlama.k_norm, w));
  }
  return w;
}

Result<RawLayer> Loader::load_layer(int64_t l, const std::string& sub, int64_t F) {
  if (c_.llama_style()) return load_llama_layer(l);
  const LayerNames& n = layer_names(c_.family);
  RawLayer w;
  auto layer = [&](int64_t li, const std::string& leaf, RawLayer& into) { return this->layer(li, sub + leaf, into); };
  auto matrix = [&](const std::string& leaf) -> Result<RawMatrix> {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, layer(l, leaf, w));
    return n.conv1d ? conv1d_of(t) : linear_of(t);
  };
  std::vector<RawMatrix> ws;
  std::vector<Tensor> bs;
  for (size_t i = 0; i < n.qkv_w.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(RawMatrix m, matrix(n.qkv_w[i]));
    ws.push_back(std::move(m));
    if (n.conv1d || c_.family == Family::kBert || c_.qkv_bias) {
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
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in, matrix(n.ffn_in_w));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in_b, layer(l, n.ffn_in_b, w));
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
  } else if (store.contains(base_names(c.family).classifier_w)) {
    c.head = c.family == Family::kBert ? HeadKind::kSequenceClassification : HeadKind::kImageClassification;
    const TensorInfo* info = store.info(base_names(c.family).classifier_w);
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
  return finish_layer(shard_raw(r, {F, F, F, r.ffn_out.k, false}, {h0, h1, h0, h1, hd}, c0, c1));
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
  return hf_wrapper(c.family);
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

// The input side: word, position (and BERT's token type) embeddings, or
// ViT's class token, positions and patch projection. GPT-2 with tied
// weights keeps one packed wte, which serves the lookup and the LM head.
core::Status load_embeddings(Loader& ld, const TensorStore& store, const ModelConfig& c, const std::string& prefix,
                             bool gpt2_tied, ModelWeights& w) {
  const BaseNames& b = base_names(c.family);
  if (c.family == Family::kBert) {
    TESSERA_ASSIGN_OR_RETURN(w.word_emb, ld.owned_base(b.word));
    TESSERA_ASSIGN_OR_RETURN(w.pos_emb, ld.owned_base(b.pos));
    TESSERA_ASSIGN_OR_RETURN(w.type_emb, ld.owned_base(b.type));
    TESSERA_ASSIGN_OR_RETURN(w.emb_ln_g, ld.owned_base(b.emb_ln_g));
    TESSERA_ASSIGN_OR_RETURN(w.emb_ln_b, ld.owned_base(b.emb_ln_b));
  } else if (c.causal()) {
    if (gpt2_tied) {
      TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(prefix + b.word));
    } else {
      TESSERA_ASSIGN_OR_RETURN(w.word_emb, ld.owned_base(b.word));
    }
    if (!c.llama_style()) {
      TESSERA_ASSIGN_OR_RETURN(w.pos_emb, ld.owned_base(b.pos));
    }
    if (c.projects_embeddings()) {
      TESSERA_ASSIGN_OR_RETURN(w.project_in_w, ld.packed(prefix + b.project_in));
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(Tensor cls, ld.owned_base(b.cls));
    w.cls_token = cls.reshaped({c.hidden});
    TESSERA_ASSIGN_OR_RETURN(Tensor pos, ld.owned_base(b.pos));
    w.pos_emb = pos.reshaped({c.max_rows(), c.hidden});
    TESSERA_ASSIGN_OR_RETURN(Tensor pw, ld.base(b.patch_w));
    w.patch_w = kernels::PackedLinear::pack(pw.reshaped({c.hidden, c.channels * c.patch_size * c.patch_size}));
    store.release(prefix + b.patch_w);
    TESSERA_ASSIGN_OR_RETURN(w.patch_b, ld.owned_base(b.patch_b));
  }
  return core::ok_status();
}

// The output side: GPT-2's final norm and LM head (tied: the packed wte,
// unless the embeddings brought it already); ViT's final norm; the pooler
// where the checkpoint has one, and the classifier.
core::Status load_head(Loader& ld, const TensorStore& store, const ModelConfig& c, const std::string& prefix,
                       bool gpt2_tied, ModelWeights& w) {
  const BaseNames& b = base_names(c.family);
  if (c.causal()) {
    if (c.family != Family::kOpt || c.final_norm) {
      TESSERA_ASSIGN_OR_RETURN(w.final_ln_g, ld.owned_base(b.final_ln_g));
    }
    if (c.family == Family::kGpt2 || (c.family == Family::kOpt && c.final_norm)) {
      TESSERA_ASSIGN_OR_RETURN(w.final_ln_b, ld.owned_base(b.final_ln_b));
    }
    if (c.projects_embeddings()) {
      TESSERA_ASSIGN_OR_RETURN(w.project_out_w, ld.packed(prefix + b.project_out));
    }
    if (c.head == HeadKind::kLmHead) {
      if (!gpt2_tied) {
        TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(b.lm_head));
      } else if (w.lm_head_w.empty()) {
        TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.packed(prefix + b.word));  // tied
      }
    }
    return core::ok_status();
  }
  if (c.family == Family::kVit) {
    TESSERA_ASSIGN_OR_RETURN(w.final_ln_g, ld.owned_base(b.final_ln_g));
    TESSERA_ASSIGN_OR_RETURN(w.final_ln_b, ld.owned_base(b.final_ln_b));
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
    dst.blocks[static_cast<size_t>(i)] = finish_layer(*bw, ld.consumed());
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
  dst = finish_layer(s.cut ? shard_raw(*lw, dims_of(c), c.head_shard(s.h0, s.h1), s.f0, s.f1) : *lw, ld.consumed());
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
  Loader ld(store, c, prefix);
  ModelWeights w;
  // Embeddings and head first, while few pages are resident: copying the big
  // word embeddings last would add their size to the peak.
  // GPT-2 and tied Llama-style heads: one packed matrix serves the lookup
  // and the head (a tied checkpoint that still stores lm_head reads it).
  const bool gpt2_tied = c.causal() && !store.contains(base_names(c.family).lm_head);
  if (opts.embeddings || opts.head) TESSERA_RETURN_IF_ERROR(load_embeddings(ld, store, c, prefix, gpt2_tied, w));
  if (opts.head) TESSERA_RETURN_IF_ERROR(load_head(ld, store, c, prefix, gpt2_tied, w));
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
