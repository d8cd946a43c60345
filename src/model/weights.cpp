#include "model/weights.h"

#include <cstring>
#include <map>
#include <set>

#include "core/check.h"

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
  return (c.family == Family::kGpt2 ? "h." + i + "." : "encoder.layer." + i + ".") + leaf;
}

void add_layer_entries(const ModelConfig& c, int64_t l, const std::string& p, std::vector<Entry>* out) {
  const int64_t F = c.hidden, I = c.intermediate;
  auto add = [&](const std::string& leaf, Shape s, bool req = true) { out->push_back({p + layer_name(c, l, leaf), s, req}); };
  if (c.family == Family::kGpt2) {
    for (const char* ln : {"ln_1", "ln_2"}) {
      add(std::string(ln) + ".weight", {F});
      add(std::string(ln) + ".bias", {F});
    }
    add("attn.c_attn.weight", {F, 3 * F});
    add("attn.c_attn.bias", {3 * F});
    add("attn.c_proj.weight", {F, F});
    add("attn.c_proj.bias", {F});
    add("mlp.c_fc.weight", {F, I});
    add("mlp.c_fc.bias", {I});
    add("mlp.c_proj.weight", {I, F});
    add("mlp.c_proj.bias", {F});
    return;
  }
  const std::string self = c.family == Family::kBert ? "attention.self." : "attention.attention.";
  for (const char* qkv : {"query", "key", "value"}) {
    add(self + qkv + ".weight", {F, F});
    add(self + qkv + ".bias", {F}, c.family == Family::kBert || c.qkv_bias);
  }
  add("attention.output.dense.weight", {F, F});
  add("attention.output.dense.bias", {F});
  add("intermediate.dense.weight", {I, F});
  add("intermediate.dense.bias", {I});
  add("output.dense.weight", {F, I});
  add("output.dense.bias", {F});
  const std::vector<std::string> lns = c.family == Family::kBert
                                           ? std::vector<std::string>{"attention.output.LayerNorm", "output.LayerNorm"}
                                           : std::vector<std::string>{"layernorm_before", "layernorm_after"};
  for (const auto& ln : lns) {
    add(ln + ".weight", {F});
    add(ln + ".bias", {F});
  }
}

std::vector<Entry> entries_for(const ModelConfig& c, const std::string& p) {
  const int64_t F = c.hidden;
  std::vector<Entry> e;
  const bool has_head = c.head != HeadKind::kNone;
  if (c.family == Family::kBert) {
    e.push_back({p + "embeddings.word_embeddings.weight", {c.vocab, F}});
    e.push_back({p + "embeddings.position_embeddings.weight", {c.max_positions, F}});
    e.push_back({p + "embeddings.token_type_embeddings.weight", {c.type_vocab, F}});
    e.push_back({p + "embeddings.LayerNorm.weight", {F}});
    e.push_back({p + "embeddings.LayerNorm.bias", {F}});
  } else if (c.family == Family::kGpt2) {
    e.push_back({p + "wte.weight", {c.vocab, F}});
    e.push_back({p + "wpe.weight", {c.max_positions, F}});
  } else {
    const int64_t ps = c.patch_size;
    e.push_back({p + "embeddings.cls_token", {1, 1, F}});
    e.push_back({p + "embeddings.position_embeddings", {1, c.max_rows(), F}});
    e.push_back({p + "embeddings.patch_embeddings.projection.weight", {F, c.channels, ps, ps}});
    e.push_back({p + "embeddings.patch_embeddings.projection.bias", {F}});
  }
  for (int64_t l = 0; l < c.layers; ++l) add_layer_entries(c, l, p, &e);
  if (c.family == Family::kGpt2) {
    e.push_back({p + "ln_f.weight", {F}});
    e.push_back({p + "ln_f.bias", {F}});
    if (c.head == HeadKind::kLmHead) e.push_back({"lm_head.weight", {c.vocab, F}, false});
  } else {
    if (c.family == Family::kVit) {
      e.push_back({p + "layernorm.weight", {F}});
      e.push_back({p + "layernorm.bias", {F}});
    }
    // BERT's classifier reads the pooler; otherwise the pooler is optional.
    const bool pooler_required = c.head == HeadKind::kSequenceClassification;
    e.push_back({p + "pooler.dense.weight", {F, F}, pooler_required});
    e.push_back({p + "pooler.dense.bias", {F}, pooler_required});
    if (has_head) {
      e.push_back({"classifier.weight", {c.num_labels(), F}});
      e.push_back({"classifier.bias", {c.num_labels()}});
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
         name.rfind("cls.", 0) == 0;
}

std::string detect_prefix(const ModelConfig& c, const TensorStore& store) {
  const std::string probe = c.family == Family::kGpt2 ? "wte.weight"
                            : c.family == Family::kBert ? "embeddings.word_embeddings.weight"
                                                        : "embeddings.cls_token";
  const std::string wrapped = c.family == Family::kGpt2 ? "transformer." : c.family == Family::kBert ? "bert." : "vit.";
  return store.contains(wrapped + probe) ? wrapped : "";
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

Tensor transpose2d(const Tensor& t) {
  const int64_t r = t.dim(0), c = t.dim(1);
  Tensor out = Tensor::zeros_f32({c, r});
  const float* s = t.f32();
  float* d = out.f32();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) d[j * r + i] = s[i * c + j];
  return out;
}

class Loader {
 public:
  Loader(const TensorStore& store, const ModelConfig& c, std::string prefix)
      : store_(store), c_(c), p_(std::move(prefix)) {}

  Result<Tensor> get(const std::string& name) { return store_.get_f32(name); }
  Result<Tensor> base(const std::string& leaf) { return get(p_ + leaf); }
  Result<Tensor> layer(int64_t l, const std::string& leaf) { return get(p_ + layer_name(c_, l, leaf)); }

  Result<LayerWeights> load_layer(int64_t l);

 private:
  const TensorStore& store_;
  const ModelConfig& c_;
  std::string p_;
};

Result<LayerWeights> Loader::load_layer(int64_t l) {
  LayerWeights w;
  if (c_.family == Family::kGpt2) {
    TESSERA_ASSIGN_OR_RETURN(Tensor qkv, layer(l, "attn.c_attn.weight"));
    w.qkv_w = transpose2d(qkv);
    TESSERA_ASSIGN_OR_RETURN(w.qkv_b, layer(l, "attn.c_attn.bias"));
    TESSERA_ASSIGN_OR_RETURN(Tensor o, layer(l, "attn.c_proj.weight"));
    w.attn_out_w = transpose2d(o);
    TESSERA_ASSIGN_OR_RETURN(w.attn_out_b, layer(l, "attn.c_proj.bias"));
    TESSERA_ASSIGN_OR_RETURN(Tensor fi, layer(l, "mlp.c_fc.weight"));
    w.ffn_in_w = transpose2d(fi);
    TESSERA_ASSIGN_OR_RETURN(w.ffn_in_b, layer(l, "mlp.c_fc.bias"));
    TESSERA_ASSIGN_OR_RETURN(Tensor fo, layer(l, "mlp.c_proj.weight"));
    w.ffn_out_w = transpose2d(fo);
    TESSERA_ASSIGN_OR_RETURN(w.ffn_out_b, layer(l, "mlp.c_proj.bias"));
    TESSERA_ASSIGN_OR_RETURN(w.ln1_g, layer(l, "ln_1.weight"));
    TESSERA_ASSIGN_OR_RETURN(w.ln1_b, layer(l, "ln_1.bias"));
    TESSERA_ASSIGN_OR_RETURN(w.ln2_g, layer(l, "ln_2.weight"));
    TESSERA_ASSIGN_OR_RETURN(w.ln2_b, layer(l, "ln_2.bias"));
    return w;
  }
  const std::string self = c_.family == Family::kBert ? "attention.self." : "attention.attention.";
  std::vector<Tensor> ws, bs;
  for (const char* n : {"query", "key", "value"}) {
    TESSERA_ASSIGN_OR_RETURN(Tensor wt, layer(l, self + n + ".weight"));
    ws.push_back(wt);
    if (c_.family == Family::kBert || c_.qkv_bias) {
      TESSERA_ASSIGN_OR_RETURN(Tensor bt, layer(l, self + n + ".bias"));
      bs.push_back(bt);
    } else {
      bs.push_back(Tensor::zeros_f32({c_.hidden}));
    }
  }
  w.qkv_w = concat_rows(ws);
  w.qkv_b = concat_rows(bs);
  TESSERA_ASSIGN_OR_RETURN(w.attn_out_w, layer(l, "attention.output.dense.weight"));
  TESSERA_ASSIGN_OR_RETURN(w.attn_out_b, layer(l, "attention.output.dense.bias"));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in_w, layer(l, "intermediate.dense.weight"));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_in_b, layer(l, "intermediate.dense.bias"));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out_w, layer(l, "output.dense.weight"));
  TESSERA_ASSIGN_OR_RETURN(w.ffn_out_b, layer(l, "output.dense.bias"));
  const std::string ln1 = c_.family == Family::kBert ? "attention.output.LayerNorm" : "layernorm_before";
  const std::string ln2 = c_.family == Family::kBert ? "output.LayerNorm" : "layernorm_after";
  TESSERA_ASSIGN_OR_RETURN(w.ln1_g, layer(l, ln1 + ".weight"));
  TESSERA_ASSIGN_OR_RETURN(w.ln1_b, layer(l, ln1 + ".bias"));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_g, layer(l, ln2 + ".weight"));
  TESSERA_ASSIGN_OR_RETURN(w.ln2_b, layer(l, ln2 + ".bias"));
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
  if (c.family == Family::kGpt2) {
    c.head = prefix.empty() ? HeadKind::kNone : HeadKind::kLmHead;
  } else if (store.contains("classifier.weight")) {
    c.head = c.family == Family::kBert ? HeadKind::kSequenceClassification : HeadKind::kImageClassification;
    const TensorInfo* info = store.info("classifier.weight");
    if (info->shape.size() == 2 && c.num_labels() != info->shape[0]) {
      c.labels.clear();
      for (int64_t i = 0; i < info->shape[0]; ++i) c.labels.push_back("LABEL_" + std::to_string(i));
    }
  }
}

// Copies columns [c0, c1) of a [rows, cols] matrix.
Tensor columns(const Tensor& t, int64_t c0, int64_t c1) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::zeros_f32({rows, c1 - c0});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.f32() + r * (c1 - c0), t.f32() + r * cols + c0, static_cast<size_t>(c1 - c0) * sizeof(float));
  return out;
}

// Copies rows [r0, r1) (any rank >= 1 tensor).
Tensor row_copy(const Tensor& t, int64_t r0, int64_t r1) { return t.rows(r0, r1).clone(); }

}  // namespace

LayerWeights shard_layer(const LayerWeights& full, int64_t F, int64_t hd, int64_t h0, int64_t h1, int64_t c0, int64_t c1) {
  LayerWeights s = full;
  std::vector<Tensor> w, b;
  for (int64_t part = 0; part < 3; ++part) {
    w.push_back(full.qkv_w.rows(part * F + h0 * hd, part * F + h1 * hd));
    b.push_back(full.qkv_b.rows(part * F + h0 * hd, part * F + h1 * hd));
  }
  s.qkv_w = (h1 > h0) ? concat_rows(w) : Tensor::zeros_f32({0, F});
  s.qkv_b = (h1 > h0) ? concat_rows(b) : Tensor::zeros_f32({0});
  s.attn_out_w = columns(full.attn_out_w, h0 * hd, h1 * hd);
  s.ffn_in_w = row_copy(full.ffn_in_w, c0, c1);
  s.ffn_in_b = row_copy(full.ffn_in_b, c0, c1);
  s.ffn_out_w = columns(full.ffn_out_w, c0, c1);
  return s;
}

size_t LayerWeights::bytes() const {
  size_t b = 0;
  for (const Tensor* t : {&qkv_w, &qkv_b, &attn_out_w, &attn_out_b, &ln1_g, &ln1_b, &ffn_in_w, &ffn_in_b, &ffn_out_w,
                          &ffn_out_b, &ln2_g, &ln2_b})
    b += t->empty() ? 0 : t->nbytes();
  return b;
}

size_t ModelWeights::bytes() const {
  size_t b = 0;
  for (const Tensor* t : {&word_emb, &pos_emb, &type_emb, &emb_ln_g, &emb_ln_b, &patch_w, &patch_b, &cls_token,
                          &final_ln_g, &final_ln_b, &pooler_w, &pooler_b, &classifier_w, &classifier_b})
    b += t->empty() ? 0 : t->nbytes();
  if (!lm_head_w.empty() && lm_head_w.raw() != word_emb.raw()) b += lm_head_w.nbytes();
  for (const auto& l : layers) b += l.bytes();
  return b;
}

std::string hf_prefix(const ModelConfig& c) {
  if (c.head == HeadKind::kNone) return "";
  return c.family == Family::kGpt2 ? "transformer." : c.family == Family::kBert ? "bert." : "vit.";
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

Result<ModelWeights> load_weights(const TensorStore& store, ModelConfig& c, const LoadOptions& opts) {
  const std::string prefix = detect_prefix(c, store);
  infer_head(c, store, prefix);
  TESSERA_RETURN_IF_ERROR(validate_names(store, entries_for(c, prefix)));
  const int64_t end = opts.layer_end < 0 ? c.layers : opts.layer_end;
  if (opts.layer_begin < 0 || opts.layer_begin > end || end > c.layers)
    return core::out_of_range("layer range [" + std::to_string(opts.layer_begin) + "," + std::to_string(end) +
                              ") outside the model's " + std::to_string(c.layers) + " layers");
  std::vector<int64_t> layers = opts.only_layers;
  if (layers.empty())
    for (int64_t l = opts.layer_begin; l < end; ++l) layers.push_back(l);
  const int64_t h1 = opts.head_end < 0 ? c.heads : opts.head_end;
  const int64_t f1 = opts.ffn_end < 0 ? c.intermediate : opts.ffn_end;
  if (opts.head_begin < 0 || opts.head_begin > h1 || h1 > c.heads || opts.ffn_begin < 0 || opts.ffn_begin > f1 ||
      f1 > c.intermediate)
    return core::out_of_range("tensor-parallel shard outside the model's heads or FFN columns");
  const bool sharded = opts.head_begin > 0 || h1 < c.heads || opts.ffn_begin > 0 || f1 < c.intermediate;
  Loader ld(store, c, prefix);
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(c.layers));
  for (int64_t l : layers) {
    if (l < 0 || l >= c.layers) return core::out_of_range("layer " + std::to_string(l) + " outside the model");
    auto lw = ld.load_layer(l);
    if (!lw.ok()) return lw.status();
    w.layers[static_cast<size_t>(l)] =
        sharded ? shard_layer(*lw, c.hidden, c.head_dim(), opts.head_begin, h1, opts.ffn_begin, f1) : std::move(lw).value();
  }
  if (opts.embeddings || opts.head) {
    if (c.family == Family::kBert) {
      TESSERA_ASSIGN_OR_RETURN(w.word_emb, ld.base("embeddings.word_embeddings.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.pos_emb, ld.base("embeddings.position_embeddings.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.type_emb, ld.base("embeddings.token_type_embeddings.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.emb_ln_g, ld.base("embeddings.LayerNorm.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.emb_ln_b, ld.base("embeddings.LayerNorm.bias"));
    } else if (c.family == Family::kGpt2) {
      TESSERA_ASSIGN_OR_RETURN(w.word_emb, ld.base("wte.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.pos_emb, ld.base("wpe.weight"));
    } else {
      TESSERA_ASSIGN_OR_RETURN(Tensor cls, ld.base("embeddings.cls_token"));
      w.cls_token = cls.reshaped({c.hidden});
      TESSERA_ASSIGN_OR_RETURN(Tensor pos, ld.base("embeddings.position_embeddings"));
      w.pos_emb = pos.reshaped({c.max_rows(), c.hidden});
      TESSERA_ASSIGN_OR_RETURN(Tensor pw, ld.base("embeddings.patch_embeddings.projection.weight"));
      w.patch_w = pw.reshaped({c.hidden, c.channels * c.patch_size * c.patch_size});
      TESSERA_ASSIGN_OR_RETURN(w.patch_b, ld.base("embeddings.patch_embeddings.projection.bias"));
    }
  }
  if (opts.head) {
    if (c.family == Family::kGpt2) {
      TESSERA_ASSIGN_OR_RETURN(w.final_ln_g, ld.base("ln_f.weight"));
      TESSERA_ASSIGN_OR_RETURN(w.final_ln_b, ld.base("ln_f.bias"));
      if (c.head == HeadKind::kLmHead) {
        if (store.contains("lm_head.weight")) {
          TESSERA_ASSIGN_OR_RETURN(w.lm_head_w, ld.get("lm_head.weight"));
        } else {
          w.lm_head_w = w.word_emb;  // tied
        }
      }
    } else {
      if (c.family == Family::kVit) {
        TESSERA_ASSIGN_OR_RETURN(w.final_ln_g, ld.base("layernorm.weight"));
        TESSERA_ASSIGN_OR_RETURN(w.final_ln_b, ld.base("layernorm.bias"));
      }
      if (store.contains(prefix + "pooler.dense.weight")) {
        TESSERA_ASSIGN_OR_RETURN(w.pooler_w, ld.base("pooler.dense.weight"));
        TESSERA_ASSIGN_OR_RETURN(w.pooler_b, ld.base("pooler.dense.bias"));
      }
      if (c.head != HeadKind::kNone) {
        TESSERA_ASSIGN_OR_RETURN(w.classifier_w, ld.get("classifier.weight"));
        TESSERA_ASSIGN_OR_RETURN(w.classifier_b, ld.get("classifier.bias"));
      }
    }
  }
  return w;
}

}  // namespace tessera::model
