// safetensors: header length, JSON header, dtypes, shapes and offsets; every
// tensor of an accepted file is read back (borrowed and as f32).
#include <memory>

#include "fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  auto bytes = std::make_shared<const std::string>(tessera::fuzz::text(data, size));
  auto f = tessera::model::SafeTensorsFile::from_bytes(bytes, "fuzz");
  if (!f.ok()) return 0;
  for (const auto& name : f->names()) {
    auto t = f->get(name);
    if (!t.ok()) __builtin_trap();  // a listed tensor must be readable
    volatile uint64_t sum = 0;
    const auto* p = static_cast<const unsigned char*>(t->raw());
    for (size_t i = 0; i < t->nbytes(); ++i) sum = sum + p[i];  // every byte inside the buffer
    (void)f->get_f32(name);
  }
  return 0;
}
