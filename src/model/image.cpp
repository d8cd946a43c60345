#include "model/image.h"

#include <stb_image.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/io.h"
#include "core/logging.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

constexpr int kMaxSide = 1 << 14;  // keeps [1,3,H,W] allocations sane
constexpr int64_t kMaxPixels = int64_t{1} << 26;  // 64 Mpx: 192 MiB decoded

// ---- Resampling (PIL's BILINEAR) ----

// Contributions of input pixels to each output pixel along one axis.
struct Filter {
  std::vector<int> first;      // first input pixel per output pixel
  std::vector<int> count;      // number of input pixels per output pixel
  std::vector<float> weights;  // [out][taps], normalized to sum to 1
  int taps = 0;
};

Filter make_filter(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double support = std::max(scale, 1.0);  // triangle radius; wider when shrinking
  Filter f;
  f.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  f.first.resize(out_size);
  f.count.resize(out_size);
  f.weights.assign(static_cast<size_t>(out_size) * f.taps, 0.0f);
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    std::vector<double> w(static_cast<size_t>(hi - lo));
    double sum = 0;
    for (int j = lo; j < hi; ++j) {
      const double d = std::abs((j + 0.5 - center) / support);
      w[j - lo] = d < 1 ? 1 - d : 0;
      sum += w[j - lo];
    }
    f.first[i] = lo;
    f.count[i] = hi - lo;
    for (int j = 0; j < hi - lo; ++j) f.weights[static_cast<size_t>(i) * f.taps + j] = static_cast<float>(w[j] / sum);
  }
  return f;
}

uint8_t to_u8(float v) { return static_cast<uint8_t>(std::clamp(std::floor(v + 0.5f), 0.0f, 255.0f)); }

// One axis of the separable resize over packed RGB: `lines` independent lines
// of `in_len` pixels become `out_len` pixels; *_step is the distance in pixels
// between neighbours along the axis, *_line_step between lines.
struct AxisPass {
  int lines, in_len, out_len;
  size_t in_step, in_line_step, out_step, out_line_step;
};

void resample_axis(const uint8_t* src, uint8_t* dst, const AxisPass& p) {
  const Filter f = make_filter(p.in_len, p.out_len);
  for (int line = 0; line < p.lines; ++line) {
    for (int o = 0; o < p.out_len; ++o) {
      const float* w = &f.weights[static_cast<size_t>(o) * f.taps];
      for (int c = 0; c < 3; ++c) {
        float acc = 0;
        for (int k = 0; k < f.count[o]; ++k) {
          acc += w[k] * src[(line * p.in_line_step + (f.first[o] + k) * p.in_step) * 3 + c];
        }
        dst[(line * p.out_line_step + o * p.out_step) * 3 + c] = to_u8(acc);
      }
    }
  }
}

std::vector<uint8_t> resize_rgb(const uint8_t* rgb, int w, int h, int out_w, int out_h) {
  std::vector<uint8_t> mid(static_cast<size_t>(out_w) * h * 3);  // horizontal pass first, as PIL does
  resample_axis(rgb, mid.data(), {h, w, out_w, 1, static_cast<size_t>(w), 1, static_cast<size_t>(out_w)});
  std::vector<uint8_t> out(static_cast<size_t>(out_w) * out_h * 3);
  resample_axis(mid.data(), out.data(),
                {out_w, h, out_h, static_cast<size_t>(out_w), 1, static_cast<size_t>(out_w), 1});
  return out;
}

// ---- preprocessor_config.json ----

core::Status read_size(const Json& size, int& image_size) {
  // Checked as 64-bit before narrowing, so 2^32 + 224 is not read as 224.
  auto side = [](const Json& v) -> core::Result<int> {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxSide)
      return core::invalid_argument("size " + v.dump() + " is not an integer in [1, " + std::to_string(kMaxSide) + "]");
    return static_cast<int>(v.get<int64_t>());
  };
  if (size.is_number_integer()) {
    TESSERA_ASSIGN_OR_RETURN(image_size, side(size));
    return core::ok_status();
  }
  if (size.is_object() && size.contains("height") && size.contains("width")) {
    TESSERA_ASSIGN_OR_RETURN(const int h, side(size["height"]));
    TESSERA_ASSIGN_OR_RETURN(const int w, side(size["width"]));
    if (h != w) return core::unimplemented("non-square size " + std::to_string(h) + "x" + std::to_string(w));
    image_size = h;
    return core::ok_status();
  }
  return core::unimplemented("size " + size.dump() + " is not supported (want an int or {height, width})");
}

core::Status read_triplet(const Json& v, const char* key, std::array<float, 3>& out) {
  if (v.is_number()) {
    out.fill(v.get<float>());
    return core::ok_status();
  }
  if (!v.is_array() || v.size() != 3) return core::parse_error(std::string(key) + " must be a number or 3 numbers");
  for (size_t i = 0; i < 3; ++i) out[i] = v[i].get<float>();
  return core::ok_status();
}

// Throws nlohmann exceptions on wrong value types; the caller converts them.
core::Status apply_config(const Json& j, ImagePreprocess& pp) {
  if (!j.is_object()) return core::parse_error("top level is not a JSON object");
  if (j.value("do_center_crop", false)) return core::unimplemented("do_center_crop is not supported");
  if (j.contains("size")) TESSERA_RETURN_IF_ERROR(read_size(j["size"], pp.image_size));
  pp.do_resize = j.value("do_resize", pp.do_resize);
  pp.do_rescale = j.value("do_rescale", pp.do_rescale);
  pp.rescale_factor = j.value("rescale_factor", pp.rescale_factor);
  pp.do_normalize = j.value("do_normalize", pp.do_normalize);
  if (j.contains("image_mean")) TESSERA_RETURN_IF_ERROR(read_triplet(j["image_mean"], "image_mean", pp.mean));
  if (j.contains("image_std")) TESSERA_RETURN_IF_ERROR(read_triplet(j["image_std"], "image_std", pp.std));
  if (j.value("resample", 2) != 2) {  // 2 is PIL's BILINEAR
    spdlog::warn("preprocessor_config.json asks for resample={}; using bilinear", j["resample"].dump());
  }
  return core::ok_status();
}

core::Status validate(const ImagePreprocess& pp) {
  if (pp.do_resize && (pp.image_size <= 0 || pp.image_size > kMaxSide)) {
    return core::invalid_argument("image size " + std::to_string(pp.image_size) + " is out of range");
  }
  for (float s : pp.std) {
    if (pp.do_normalize && !(std::abs(s) > 0)) return core::invalid_argument("image_std has a zero entry");
  }
  return core::ok_status();
}

}  // namespace

core::Result<ImagePreprocess> load_image_preprocess(const std::string& model_dir, int model_image_size) {
  ImagePreprocess pp;
  pp.image_size = model_image_size;
  const std::string path = model_dir + "/preprocessor_config.json";
  if (core::file_exists(path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
    try {
      const core::Status st = apply_config(Json::parse(text), pp);
      if (!st.ok()) return st.with_context(path);
    } catch (const Json::exception& e) {
      return core::parse_error(path + ": " + e.what());
    }
  }
  TESSERA_RETURN_IF_ERROR(validate(pp));
  return pp;
}

core::Result<core::Tensor> preprocess_rgb(const uint8_t* rgb, int width, int height, const ImagePreprocess& pp) {
  if (rgb == nullptr || width <= 0 || height <= 0 || width > kMaxSide || height > kMaxSide) {
    return core::invalid_argument("bad image of " + std::to_string(width) + "x" + std::to_string(height) + " pixels");
  }
  TESSERA_RETURN_IF_ERROR(validate(pp));
  std::vector<uint8_t> resized;
  int w = width, h = height;
  if (pp.do_resize && (w != pp.image_size || h != pp.image_size)) {
    w = h = pp.image_size;
    resized = resize_rgb(rgb, width, height, w, h);
    rgb = resized.data();
  }
  core::Tensor out = core::Tensor::zeros_f32({1, 3, h, w});
  float* dst = out.f32();
  const size_t plane = static_cast<size_t>(w) * h;
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < 3; ++c) {
      float v = rgb[i * 3 + c];
      if (pp.do_rescale) v *= pp.rescale_factor;
      if (pp.do_normalize) v = (v - pp.mean[c]) / pp.std[c];
      dst[c * plane + i] = v;
    }
  }
  return out;
}

namespace {
// Every PNG chunk must fit in the file: stb_image grows its IDAT buffer to a
// chunk's declared length before reading it, so a 3x3 PNG declaring a 700 MB
// chunk made it allocate 2 GiB (found by fuzz_image).
core::Status check_png_chunks(const std::string& bytes, const std::string& name) {
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at])) << 24) |
           (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 2])) << 8) | static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 3]));
  };
  size_t at = 8;  // after the signature
  while (at + 8 <= bytes.size()) {
    const uint64_t len = be32(at);
    if (at + 12 + len > bytes.size())
      return core::invalid_argument("cannot decode image '" + name + "': a PNG chunk at byte " + std::to_string(at) +
                                    " declares " + std::to_string(len) + " bytes, the file has " +
                                    std::to_string(bytes.size() - at - std::min<size_t>(12, bytes.size() - at)) + " left");
    if (bytes.compare(at + 4, 4, "IEND") == 0) break;
    at += 12 + len;
  }
  return core::ok_status();
}
}  // namespace

core::Result<core::Tensor> decode_image(const std::string& bytes, const ImagePreprocess& pp, const std::string& name) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return core::invalid_argument("'" + name + "' is too large to decode");
  }
  // PNG and JPEG only, by their signatures: stb_image's other loaders are
  // not needed, and its PNM loader reads past the buffer on a truncated
  // 16-bit file (found by fuzz_image).
  const bool png = bytes.rfind("\x89PNG\r\n\x1a\n", 0) == 0;
  const bool jpeg = bytes.rfind("\xff\xd8\xff", 0) == 0;
  if (!png && !jpeg) return core::invalid_argument("cannot decode image '" + name + "': neither a PNG nor a JPEG");
  if (png) TESSERA_RETURN_IF_ERROR(check_png_chunks(bytes, name));
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  int w = 0, h = 0, channels = 0;
  // Dimensions from the header first: a small file can declare a huge image,
  // and decoding it would allocate before any check could run.
  if (!stbi_info_from_memory(data, len, &w, &h, &channels))
    return core::invalid_argument("cannot decode image '" + name + "': " + stbi_failure_reason());
  if (w <= 0 || h <= 0 || w > kMaxSide || h > kMaxSide || static_cast<int64_t>(w) * h > kMaxPixels)
    return core::invalid_argument("image '" + name + "' is " + std::to_string(w) + "x" + std::to_string(h) +
                                  " pixels; at most " + std::to_string(kMaxSide) + " per side and " +
                                  std::to_string(kMaxPixels) + " in all");
  std::unique_ptr<uint8_t, void (*)(void*)> pixels(
      stbi_load_from_memory(data, len, &w, &h, &channels, /*desired_channels=*/3), stbi_image_free);
  if (!pixels) return core::invalid_argument("cannot decode image '" + name + "': " + stbi_failure_reason());
  auto tensor = preprocess_rgb(pixels.get(), w, h, pp);
  if (!tensor.ok()) return tensor.status().with_context(name);
  return tensor;
}

core::Result<core::Tensor> load_image(const std::string& path, const ImagePreprocess& pp) {
  TESSERA_ASSIGN_OR_RETURN(const std::string bytes, core::read_file(path));
  return decode_image(bytes, pp, path);
}

}  // namespace tessera::model
