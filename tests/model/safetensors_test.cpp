// safetensors parsing, writing, and every malformed-file case we reject.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "core/io.h"
#include "model/safetensors.h"

namespace tessera::model {
namespace {

std::string with_header(const std::string& header, const std::string& data, int64_t claimed = -1) {
  const uint64_t len = claimed < 0 ? header.size() : static_cast<uint64_t>(claimed);
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return out + header + data;
}

core::Status parse(const std::string& bytes) {
  return SafeTensorsFile::from_bytes(std::make_shared<const std::string>(bytes)).status();
}

TEST(SafeTensorsTest, RoundTripsTensors) {
  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  std::map<std::string, core::Tensor> t;
  t["a"] = core::Tensor::from_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  t["b"] = core::Tensor::from_i64({2}, {7, -8});
  ASSERT_TRUE(write_safetensors(path, t, {{"format", "pt"}}).ok());
  auto f = SafeTensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  auto a = f->get_f32("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape(), (core::Shape{2, 3}));
  EXPECT_EQ(a->f32()[5], 6.0f);
  EXPECT_EQ(f->get("b")->i64()[1], -8);
  EXPECT_FALSE(f->get("zzz").ok());
}

TEST(SafeTensorsTest, ConvertsHalfPrecisionOnLoad) {
  // 1.5 in F16 is 0x3E00, in BF16 0x3FC0.
  const std::string data = std::string("\x00\x3e", 2) + std::string("\xc0\x3f", 2);
  auto f = SafeTensorsFile::from_bytes(std::make_shared<const std::string>(with_header(
      R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}})", data)));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->get_f32("h")->f32()[0], 1.5f);
  EXPECT_EQ(f->get_f32("b")->f32()[0], 1.5f);
}

struct BadCase {
  const char* what;
  std::string bytes;
  const char* message_part;
};

TEST(SafeTensorsTest, RejectsMalformedFiles) {
  const std::string f8(8, '\0');
  const BadCase cases[] = {
      {"truncated", std::string("\x10\x00", 2), "too short"},
      {"header past end", with_header("{}", "", 1000), "past the end"},
      {"bad json", with_header("{not json", ""), "not valid JSON"},
      {"header not object", with_header("[1,2]", ""), "not valid JSON"},
      {"unknown dtype", with_header(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", f8), "unsupported dtype"},
      {"offsets out of range", with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f8), "outside the data"},
      {"offsets reversed", with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f8), "outside the data"},
      {"shape/bytes mismatch", with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f8), "needs 12 bytes"},
      {"negative dim", with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f8), "non-negative"},
      {"overlap", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8), "overlap"},
      {"missing offsets", with_header(R"({"a":{"dtype":"F32","shape":[2]}})", f8), "data_offsets"},
      {"huge shape", with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f8), "too large"},
  };
  for (const auto& c : cases) {
    const core::Status st = parse(c.bytes);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.message_part), std::string::npos) << c.what << ": " << st.message();
    EXPECT_EQ(st.to_string().find('\n'), std::string::npos) << c.what;
  }
}

TEST(SafeTensorsTest, OpenReportsMissingAndEmptyFiles) {
  EXPECT_EQ(SafeTensorsFile::open("/nonexistent/x.safetensors").status().code(), core::ErrorCode::kIoError);
  const std::string empty = ::testing::TempDir() + "/empty.safetensors";
  ASSERT_TRUE(core::write_file(empty, "").ok());
  EXPECT_FALSE(SafeTensorsFile::open(empty).ok());
}

TEST(SafeTensorsTest, ShardedIndexIsFollowed) {
  const std::string dir = ::testing::TempDir() + "/sharded";
  std::system(("mkdir -p " + dir).c_str());
  std::map<std::string, core::Tensor> a, b;
  a["x"] = core::Tensor::from_f32({1}, {1.0f});
  b["y"] = core::Tensor::from_f32({1}, {2.0f});
  ASSERT_TRUE(write_safetensors(dir + "/model-00001-of-00002.safetensors", a).ok());
  ASSERT_TRUE(write_safetensors(dir + "/model-00002-of-00002.safetensors", b).ok());
  ASSERT_TRUE(core::write_file(dir + "/model.safetensors.index.json",
                               R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})")
                  .ok());
  auto store = TensorStore::open_dir(dir);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ(store->get_f32("y")->f32()[0], 2.0f);
  ASSERT_TRUE(core::write_file(dir + "/model.safetensors.index.json", R"({"weight_map":{"x":"../evil"}})").ok());
  EXPECT_FALSE(TensorStore::open_dir(dir).ok());
}

}  // namespace
}  // namespace tessera::model
