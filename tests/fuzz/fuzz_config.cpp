// config.json of every family (Llama-style included), and preprocessor-free model config checks.
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  auto c = tessera::model::parse_config(tessera::fuzz::text(data, size));
  if (c.ok()) {
    // Accepted configs must satisfy the invariants the model code relies on.
    if (c->hidden < 1 || c->heads < 1 || c->layers < 1) __builtin_trap();
    if (c->explicit_head_dim == 0 && c->hidden % c->heads != 0) __builtin_trap();
    // Llama-style: whole K/V groups, RoPE pairs with one frequency each.
    if (c->kv_head_count() < 1 || c->heads % c->kv_head_count() != 0) __builtin_trap();
    if (c->llama_style() && (c->head_dim() % 2 != 0 || static_cast<int64_t>(c->rope_inv_freq.size()) != c->head_dim() / 2))
      __builtin_trap();
    (void)c->max_rows();
  }
  return 0;
}
