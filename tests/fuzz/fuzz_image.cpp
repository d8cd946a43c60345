// Image decoding (PNG, JPEG, BMP, GIF, ... through stb_image) and the
// ViT preprocessing of whatever decodes.
#include "fuzz_util.h"
#include "model/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  tessera::model::ImagePreprocess pp;
  pp.image_size = 8;  // small: the resize runs on every accepted image
  auto t = tessera::model::decode_image(tessera::fuzz::text(data, size), pp, "fuzz");
  if (t.ok() && t->shape() != tessera::core::Shape{1, 3, 8, 8}) __builtin_trap();
  return 0;
}
