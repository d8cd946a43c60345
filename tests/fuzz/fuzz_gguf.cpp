// GGUF: header, metadata, tensor infos, offsets; for an accepted file every
// readable tensor is read whole, and the model mapping, the config and the
// tokenizer built from its metadata either succeed or say why.
#include <memory>

#include "fuzz_util.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  auto bytes = std::make_shared<const std::string>(tessera::fuzz::text(data, size));
  auto f = tessera::model::GgufFile::from_bytes(bytes, "fuzz");
  if (!f.ok()) return 0;
  for (const auto& t : f->tensors()) {
    volatile uint64_t sum = 0;
    for (size_t i = 0; i < t.nbytes; ++i) sum = sum + t.data[i];  // every byte inside the buffer
    if (t.nbytes <= (size_t{1} << 20)) (void)f->get_f32(t.name);
  }
  if (auto map = tessera::model::gguf_tensor_map(*f); map.ok())
    for (const auto& m : *map)
      if (f->tensor(m.gguf_name)->nbytes <= (size_t{1} << 20)) {
        (void)tessera::model::gguf_read(*f, m);
        (void)tessera::model::gguf_blocks(*f, m);  // a quantized matrix's rows, Q/K order undone
      }
  if (auto text = tessera::model::gguf_config_json(*f); text.ok()) (void)tessera::model::parse_config(*text);
  (void)tessera::model::gguf_tokenizer(*f);
  (void)tessera::model::gguf_chat_template(*f);
  return 0;
}
