// Image input for vision models: decode PNG/JPEG and turn it into the
// pixel_values tensor Hugging Face image processors (ViT style) produce.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace tessera::model {

struct ImagePreprocess {
  int image_size = 224;  // square output side when do_resize
  bool do_resize = true;
  bool do_rescale = true;
  float rescale_factor = 1.0f / 255;
  bool do_normalize = true;
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
};

// Reads <dir>/preprocessor_config.json if present (keys: size {height,width}
// or int, do_resize, do_rescale, rescale_factor, do_normalize, image_mean,
// image_std); defaults otherwise, with image_size = model_image_size.
// Settings we cannot honour (non-square size, center crop) are errors.
core::Result<ImagePreprocess> load_image_preprocess(const std::string& model_dir, int model_image_size);

// PNG or JPEG (stb_image; other formats are refused) -> pixel_values F32 [1,3,H,W]: converted to
// RGB (alpha dropped, like PIL's convert("RGB")), resized, then rescaled and
// normalized. JPEG EXIF orientation is not applied.
core::Result<core::Tensor> load_image(const std::string& path, const ImagePreprocess& pp);
// The same from the file's bytes; `name` labels errors. Dimensions are read
// from the header and checked before anything is decoded.
core::Result<core::Tensor> decode_image(const std::string& bytes, const ImagePreprocess& pp, const std::string& name);

// The same from packed 8-bit RGB (width*height*3 bytes, row-major).
// Resizing is PIL's BILINEAR: a triangle filter on half-pixel centres whose
// support widens when shrinking (antialiasing), applied horizontally then
// vertically with 8-bit rounding after each pass. It matches PIL up to PIL's
// fixed-point weights (a pixel can differ by one 8-bit level).
core::Result<core::Tensor> preprocess_rgb(const uint8_t* rgb, int width, int height, const ImagePreprocess& pp);

}  // namespace tessera::model
