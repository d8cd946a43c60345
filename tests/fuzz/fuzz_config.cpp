// config.json of every family, and preprocessor-free model config checks.
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  auto c = tessera::model::parse_config(tessera::fuzz::text(data, size));
  if (c.ok()) {
    // Accepted configs must satisfy the invariants the model code relies on.
    if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads != 0 || c->layers < 1) __builtin_trap();
    (void)c->max_rows();
  }
  return 0;
}
