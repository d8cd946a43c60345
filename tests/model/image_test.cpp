// Image decoding and ViT preprocessing against scalar references.
#include "model/image.h"

#include <gtest/gtest.h>
#include <stb/stb_image_write.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "core/io.h"

namespace tessera::model {
namespace {

std::string temp_dir() {
  const std::string dir = ::testing::TempDir() + "tessera_image_test";
  std::filesystem::create_directories(dir);
  return dir;
}

// Packed RGB where each channel follows its own function of (x, y).
std::vector<uint8_t> pattern(int w, int h, int (*fn)(int x, int y, int c)) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) rgb[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(fn(x, y, c));
    }
  }
  return rgb;
}

float at(const core::Tensor& t, int c, int y, int x) {
  const int64_t h = t.dim(2), w = t.dim(3);
  return t.f32()[(c * h + y) * w + x];
}

std::string write_png(const std::string& name, const std::vector<uint8_t>& pixels, int w, int h, int comp) {
  const std::string path = temp_dir() + "/" + name;
  EXPECT_NE(stbi_write_png(path.c_str(), w, h, comp, pixels.data(), w * comp), 0);
  return path;
}

TEST(Image, PngWithoutResizeIsExact) {
  constexpr int kW = 5, kH = 4;
  const auto rgb = pattern(kW, kH, [](int x, int y, int c) { return (x * 50 + y * 13 + c * 70) % 256; });
  const std::string path = write_png("exact.png", rgb, kW, kH, 3);
  ImagePreprocess pp;
  pp.do_resize = false;
  auto t = load_image(path, pp);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->shape(), (core::Shape{1, 3, kH, kW}));
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < kH; ++y) {
      for (int x = 0; x < kW; ++x) {
        const float v = rgb[(y * kW + x) * 3 + c] * (1.0f / 255);
        // Equal up to rounding: -march=native may fuse the multiply-adds differently.
        EXPECT_NEAR(at(t.value(), c, y, x), (v - 0.5f) / 0.5f, 1e-6f) << c << "," << y << "," << x;
      }
    }
  }
}

TEST(Image, CustomMeanStdAndNoRescale) {
  const auto rgb = pattern(2, 2, [](int x, int y, int c) { return x * 100 + y * 10 + c; });
  ImagePreprocess pp;
  pp.do_resize = false;
  pp.do_rescale = false;
  pp.mean = {1, 2, 3};
  pp.std = {2, 4, 8};
  auto t = preprocess_rgb(rgb.data(), 2, 2, pp);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(at(t.value(), 2, 1, 1), (112.0f - 3) / 8);
  pp.do_normalize = false;
  EXPECT_EQ(at(preprocess_rgb(rgb.data(), 2, 2, pp).value(), 1, 0, 1), 101.0f);
}

// Upscaling: plain bilinear on half-pixel centres, clamped at the borders.
// Multiples of 16 keep every intermediate value integral, so 8-bit rounding
// between passes cannot matter.
TEST(Image, UpscaleMatchesBilinearReference) {
  constexpr int kIn = 4, kOut = 8;
  const auto fn = [](int x, int y, int c) { return ((x * 3 + y * 5 + c * 7) % 16) * 16; };
  const auto rgb = pattern(kIn, kIn, fn);
  const std::string path = write_png("up.png", rgb, kIn, kIn, 3);
  ImagePreprocess pp;
  pp.image_size = kOut;
  pp.do_rescale = pp.do_normalize = false;
  auto t = load_image(path, pp);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->shape(), (core::Shape{1, 3, kOut, kOut}));
  const auto clamp = [](int v) { return std::clamp(v, 0, kIn - 1); };
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < kOut; ++y) {
      for (int x = 0; x < kOut; ++x) {
        const double sx = (x + 0.5) * kIn / kOut - 0.5, sy = (y + 0.5) * kIn / kOut - 0.5;
        const int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
        const double fx = sx - x0, fy = sy - y0;
        const auto p = [&](int xx, int yy) { return static_cast<double>(fn(clamp(xx), clamp(yy), c)); };
        const double want = (1 - fy) * ((1 - fx) * p(x0, y0) + fx * p(x0 + 1, y0)) +
                            fy * ((1 - fx) * p(x0, y0 + 1) + fx * p(x0 + 1, y0 + 1));
        EXPECT_NEAR(at(t.value(), c, y, x), want, 1e-4) << c << "," << y << "," << x;
      }
    }
  }
}

// Halving: PIL's antialiased bilinear is a [1 3 3 1]/8 kernel, renormalized
// at the borders. Rows are constant, so only the horizontal pass matters.
TEST(Image, DownscaleMatchesAntialiasedReference) {
  constexpr int kIn = 8, kOut = 4;
  const int cols[kIn] = {0, 255, 10, 200, 37, 90, 255, 3};
  std::vector<uint8_t> rgb(kIn * kIn * 3);
  for (int y = 0; y < kIn; ++y) {
    for (int x = 0; x < kIn; ++x) {
      for (int c = 0; c < 3; ++c) rgb[(y * kIn + x) * 3 + c] = static_cast<uint8_t>(c == 1 ? 255 - cols[x] : cols[x]);
    }
  }
  ImagePreprocess pp;
  pp.image_size = kOut;
  pp.do_rescale = pp.do_normalize = false;
  auto t = preprocess_rgb(rgb.data(), kIn, kIn, pp);
  ASSERT_TRUE(t.ok());
  for (int c = 0; c < 3; ++c) {
    const auto p = [&](int x) { return static_cast<double>(c == 1 ? 255 - cols[x] : cols[x]); };
    const double want[kOut] = {
        std::round((3 * p(0) + 3 * p(1) + p(2)) / 7), std::round((p(1) + 3 * p(2) + 3 * p(3) + p(4)) / 8),
        std::round((p(3) + 3 * p(4) + 3 * p(5) + p(6)) / 8), std::round((p(5) + 3 * p(6) + 3 * p(7)) / 7)};
    for (int y = 0; y < kOut; ++y) {
      for (int x = 0; x < kOut; ++x) EXPECT_EQ(at(t.value(), c, y, x), want[x]) << c << "," << y << "," << x;
    }
  }
}

TEST(Image, GrayscalePngBecomesRgb) {
  const std::vector<uint8_t> gray = {0, 64, 128, 255};
  const std::string path = write_png("gray.png", gray, 2, 2, 1);
  ImagePreprocess pp;
  pp.do_resize = pp.do_rescale = pp.do_normalize = false;
  auto t = load_image(path, pp);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (int c = 0; c < 3; ++c) EXPECT_EQ(at(t.value(), c, 1, 0), 128.0f);
}

TEST(Image, SameSizeResizeIsIdentity) {
  const auto rgb = pattern(6, 6, [](int x, int y, int c) { return (x * 41 + y * 17 + c * 5) % 256; });
  ImagePreprocess pp;
  pp.image_size = 6;
  pp.do_rescale = pp.do_normalize = false;
  auto t = preprocess_rgb(rgb.data(), 6, 6, pp);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(at(t.value(), 2, 5, 3), rgb[(5 * 6 + 3) * 3 + 2]);
}

TEST(Image, NonSquareInputResizesToSquare) {
  const auto rgb = pattern(7, 3, [](int, int, int c) { return 50 * c; });
  ImagePreprocess pp;
  pp.image_size = 5;
  pp.do_rescale = pp.do_normalize = false;
  auto t = preprocess_rgb(rgb.data(), 7, 3, pp);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->shape(), (core::Shape{1, 3, 5, 5}));
  EXPECT_EQ(at(t.value(), 2, 4, 4), 100.0f);  // a constant image stays constant
}

TEST(Image, UndecodableFileIsAnError) {
  const std::string path = temp_dir() + "/garbage.png";
  ASSERT_TRUE(core::write_file(path, "this is not an image at all").ok());
  auto t = load_image(path, ImagePreprocess{});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), core::ErrorCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("cannot decode image"), std::string::npos);
  EXPECT_FALSE(load_image(temp_dir() + "/missing.png", ImagePreprocess{}).ok());
}

TEST(Image, BadArgumentsAreErrors) {
  const std::vector<uint8_t> rgb(12, 0);
  ImagePreprocess pp;
  EXPECT_FALSE(preprocess_rgb(nullptr, 2, 2, pp).ok());
  EXPECT_FALSE(preprocess_rgb(rgb.data(), 0, 2, pp).ok());
  pp.std = {0.5f, 0.0f, 0.5f};
  EXPECT_FALSE(preprocess_rgb(rgb.data(), 2, 2, pp).ok());
}

TEST(ImagePreprocessConfig, DefaultsWithoutFile) {
  auto pp = load_image_preprocess(temp_dir() + "/no_model_here", 32);
  ASSERT_TRUE(pp.ok()) << pp.status().to_string();
  EXPECT_EQ(pp->image_size, 32);
  EXPECT_TRUE(pp->do_resize && pp->do_rescale && pp->do_normalize);
  EXPECT_EQ(pp->mean[1], 0.5f);
}

TEST(ImagePreprocessConfig, ReadsHuggingFaceKeys) {
  const std::string dir = temp_dir() + "/model";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(core::write_file(dir + "/preprocessor_config.json", R"({
    "do_normalize": true, "do_rescale": false, "do_resize": true, "resample": 2,
    "image_mean": [0.485, 0.456, 0.406], "image_std": 0.25,
    "image_processor_type": "ViTImageProcessor", "rescale_factor": 0.5,
    "size": {"height": 64, "width": 64}})")
                  .ok());
  auto pp = load_image_preprocess(dir, 224);
  ASSERT_TRUE(pp.ok()) << pp.status().to_string();
  EXPECT_EQ(pp->image_size, 64);
  EXPECT_FALSE(pp->do_rescale);
  EXPECT_EQ(pp->rescale_factor, 0.5f);
  EXPECT_EQ(pp->mean[0], 0.485f);
  EXPECT_EQ(pp->std[2], 0.25f);

  ASSERT_TRUE(core::write_file(dir + "/preprocessor_config.json", R"({"size": 48})").ok());
  EXPECT_EQ(load_image_preprocess(dir, 224)->image_size, 48);
}

TEST(ImagePreprocessConfig, BadConfigsAreErrors) {
  const std::string dir = temp_dir() + "/bad_model";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/preprocessor_config.json";
  for (const char* bad : {"{not json", R"({"size": {"height": 224, "width": 160}})", R"({"image_mean": [1, 2]})",
                          R"({"do_resize": "yes"})", R"({"image_std": [1, 0, 1]})", "[]"}) {
    ASSERT_TRUE(core::write_file(path, bad).ok());
    EXPECT_FALSE(load_image_preprocess(dir, 224).ok()) << bad;
  }
}

}  // namespace
}  // namespace tessera::model
