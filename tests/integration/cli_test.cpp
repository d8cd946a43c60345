// The `tessera` binary end to end: real outputs against the Hugging Face
// fixtures, and every kind of bad input giving a one-line error and a
// non-zero exit (never a crash).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/io.h"
#include "model/safetensors.h"

namespace tessera {
namespace {

const std::string kData = TESSERA_TEST_DATA;
const std::string kBin = TESSERA_BIN;

struct CmdResult {
  int code = -1;
  bool signaled = false;
  std::string out, err;
};

// Per-test paths: ctest runs tests of this binary in parallel processes.
std::string tmp(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/" + info->name() + "-" + std::to_string(::getpid()) + "-" + name;
}

CmdResult run(const std::string& args) {
  const std::string out = tmp("cli_out.txt"), err = tmp("cli_err.txt");
  const int status = std::system((kBin + " " + args + " >" + out + " 2>" + err).c_str());
  CmdResult r;
  r.signaled = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 128);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = core::read_file(out).value();
  r.err = core::read_file(err).value();
  return r;
}

// A copy of a fixture folder whose file `file` is replaced by `content`.
std::string broken_copy(const std::string& fixture, const std::string& file, const std::string& content) {
  const std::string dir = tmp("broken-" + fixture + "-" + std::to_string(std::hash<std::string>{}(file + content) % 100000));
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + kData + "/" + fixture + "/*.json " + kData + "/" + fixture +
               "/model.safetensors " + dir + "/ && chmod -R u+w " + dir)
                  .c_str());
  EXPECT_TRUE(core::write_file(dir + "/" + file, content).ok());
  return dir;
}

std::string ids_arg(const core::Tensor& t) {
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? "," : "") + std::to_string(t.i64()[i]);
  return s;
}

float max_diff(const core::Tensor& a, const core::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}

TEST(CliTest, DumpReproducesFixturesForAllFamilies) {
  auto bert = model::SafeTensorsFile::open(kData + "/bert-tiny/cases.safetensors").value();
  auto r = run("run --model " + kData + "/bert-tiny --ids " + ids_arg(bert.get("s33.input_ids").value()) + " --token-types " +
               ids_arg(bert.get("s33.token_type_ids").value()) + " --dump " + tmp("bert.safetensors") + " --threads 2");
  ASSERT_EQ(r.code, 0) << r.err;
  auto dump = model::SafeTensorsFile::open(tmp("bert.safetensors")).value();
  EXPECT_LT(max_diff(dump.get("hidden.2").value(), bert.get("s33.hidden.2").value()), 1e-4f);
  EXPECT_LT(max_diff(dump.get("logits").value(), bert.get("s33.logits").value()), 1e-4f);

  auto gpt = model::SafeTensorsFile::open(kData + "/gpt2-tiny/cases.safetensors").value();
  r = run("run --model " + kData + "/gpt2-tiny --ids " + ids_arg(gpt.get("s13.input_ids").value()) + " --dump " +
          tmp("gpt.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  dump = model::SafeTensorsFile::open(tmp("gpt.safetensors")).value();
  EXPECT_LT(max_diff(dump.get("hidden.2").value(), gpt.get("s13.hidden.2").value()), 1e-4f);
  EXPECT_LT(max_diff(dump.get("logits").value(), gpt.get("s13.logits").value()), 1e-4f);

  auto vit = model::SafeTensorsFile::open(kData + "/vit-tiny/cases.safetensors").value();
  std::map<std::string, core::Tensor> px{{"pixel_values", vit.get("c0.pixel_values").value()}};
  ASSERT_TRUE(model::write_safetensors(tmp("pixels.safetensors"), px).ok());
  r = run("run --model " + kData + "/vit-tiny --pixels " + tmp("pixels.safetensors") + " --dump " + tmp("vit.safetensors") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"label\""), std::string::npos);
  dump = model::SafeTensorsFile::open(tmp("vit.safetensors")).value();
  EXPECT_LT(max_diff(dump.get("hidden.2").value(), vit.get("c0.hidden.2").value()), 1e-4f);
  EXPECT_LT(max_diff(dump.get("logits").value(), vit.get("c0.logits").value()), 1e-4f);
}

TEST(CliTest, GenerateReproducesGreedyFixture) {
  auto gpt = model::SafeTensorsFile::open(kData + "/gpt2-tiny/cases.safetensors").value();
  const auto prompt = gpt.get("generate.prompt").value();
  const auto want = gpt.get("generate.output").value();
  auto r = run("generate --model " + kData + "/gpt2-tiny --ids " + ids_arg(prompt) + " --max-new-tokens " +
               std::to_string(want.numel() - prompt.numel()) + " --greedy");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string all = ids_arg(want);
  const std::string tail = all.substr(ids_arg(prompt).size() + 1);
  EXPECT_EQ(r.out, tail + "\n");
}

TEST(CliTest, TextInputIsTokenized) {
  const std::string dir = broken_copy("gpt2-tiny", "tokenizer.json",
                                      core::read_file(kData + "/tokenizers/bytelevel_bpe/tokenizer.json").value());
  auto r = run("run --model " + dir + " --text 'Hello world' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"input_ids\":["), std::string::npos) << r.out;
}

struct BadInput {
  const char* what;
  std::string args;
  const char* message_part;
};

TEST(CliTest, BadInputsGiveOneLineErrors) {
  const std::string bert = kData + "/bert-tiny";
  std::string truncated = core::read_file(bert + "/model.safetensors").value().substr(0, 5000);
  std::string past_end = std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8) + "{}";
  const std::string gpt2_with_tokenizer = broken_copy(
      "gpt2-tiny", "tokenizer.json", core::read_file(kData + "/tokenizers/bytelevel_bpe/tokenizer.json").value());
  const std::string png = tmp("garbage.png");
  ASSERT_TRUE(core::write_file(png, "this is not an image at all").ok());
  const BadInput cases[] = {
      {"no such model", "run --model /nonexistent --ids 1", "cannot open"},
      {"truncated weights", "run --model " + broken_copy("bert-tiny", "model.safetensors", truncated) + " --ids 1", "outside the data section"},
      {"header past end", "run --model " + broken_copy("bert-tiny", "model.safetensors", past_end) + " --ids 1", "past the end"},
      {"bad config json", "run --model " + broken_copy("bert-tiny", "config.json", "{\"model_type\": \"bert\",") + " --ids 1", "not a valid JSON"},
      {"unknown architecture", "run --model " + broken_copy("bert-tiny", "config.json", R"({"model_type":"t5"})") + " --ids 1", "not supported"},
      {"too long", "run --model " + bert + " --ids " + "$(seq -s, 1 129)", "longer than max_position_embeddings"},
      {"id out of vocab", "run --model " + bert + " --ids 1,99999", "outside the vocabulary"},
      {"garbage ids", "run --model " + bert + " --ids 1,x", "not an integer"},
      {"empty input", "run --model " + bert + " --ids ''", "exactly one input"},
      {"invalid utf-8", "run --model " + gpt2_with_tokenizer + " --text \"$(printf 'ab\\377\\376')\"", "UTF-8"},
      {"undecodable image", "run --model " + kData + "/vit-tiny --image " + png, "image"},
      {"text to vit", "run --model " + kData + "/vit-tiny --ids 1,2", "ViT"},
      {"two inputs", "run --model " + bert + " --ids 1 --text hi", "exactly one input"},
  };
  for (const auto& c : cases) {
    const CmdResult r = run(c.args);
    EXPECT_FALSE(r.signaled) << c.what << ": crashed";
    EXPECT_NE(r.code, 0) << c.what;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << c.what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.what << ": " << r.err;
    EXPECT_NE(r.err.find(c.message_part), std::string::npos) << c.what << ": " << r.err;
  }
}

// The audit's CLI findings: each an abort, a hang or silence before its fix.
TEST(CliTest, AuditedInputsGiveOneLineErrors) {
  const std::string bert = kData + "/bert-tiny", gpt2 = kData + "/gpt2-tiny";
  const std::string key = tmp("format-number.key");
  ASSERT_TRUE(core::write_file(key, R"({"format":1})").ok());
  const std::string fifo_model = broken_copy("bert-tiny", "config.json", "{}");
  ASSERT_EQ(std::system(("rm " + fifo_model + "/config.json && mkfifo " + fifo_model + "/config.json").c_str()), 0);
  const std::string fifo_key = tmp("fifo.key");
  ::unlink(fifo_key.c_str());
  ASSERT_EQ(::mkfifo(fifo_key.c_str(), 0600), 0);
  const std::string cluster = tmp("cluster.toml");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"tcp://127.0.0.1:2\"\nworkers = [\"tcp://127.0.0.1:3\"]\n").ok());
  const BadInput cases[] = {
      // Defect 1: uncaught nlohmann::type_error (abort) in both commands.
      {"worker key format 1", "worker --key " + key + " --listen tcp://127.0.0.1:1", "not a tessera cluster key file"},
      {"run key format 1", "run --model " + bert + " --ids 1,2 --strategy voltage --devices 2 --key " + key, "not a tessera cluster key file"},
      {"cluster key format 1", "run --model " + bert + " --ids 1,2 --strategy voltage --cluster " + cluster + " --key " + key, "not a tessera cluster key file"},
      // Defect 4: hung (negative = forever) or overflowed int.
      {"negative timeout", "run --model " + bert + " --ids 1,2 --strategy voltage --devices 2 --timeout -5", "--timeout"},
      {"huge timeout", "run --model " + bert + " --ids 1,2 --strategy voltage --devices 2 --timeout 3000000", "--timeout"},
      {"zero timeout", "run --model " + bert + " --ids 1,2 --timeout 0", "--timeout"},
      // Nonsense generation options ran silently.
      {"generate -1", "run --model " + gpt2 + " --ids 1,2 --generate -1", "--generate"},
      {"max-new-tokens -1", "generate --model " + gpt2 + " --ids 1,2 --max-new-tokens -1", ">= 0"},
      {"temperature 0", "run --model " + gpt2 + " --ids 1,2 --generate 2 --temperature 0", "--temperature"},
      {"temperature nan", "run --model " + gpt2 + " --ids 1,2 --generate 2 --temperature nan", "--temperature"},
      {"temperature inf", "generate --model " + gpt2 + " --ids 1,2 --max-new-tokens 2 --temperature inf", "--temperature"},
      {"top-p nan", "run --model " + gpt2 + " --ids 1,2 --generate 2 --top-p nan", "--top-p"},
      {"top-p 2", "generate --model " + gpt2 + " --ids 1,2 --max-new-tokens 2 --top-p 2", "--top-p"},
      {"top-k -1", "run --model " + gpt2 + " --ids 1,2 --generate 2 --top-k -1", "--top-k"},
      // Non-regular files hung the load.
      {"config is a fifo", "run --model " + fifo_model + " --ids 1,2", "not a regular file"},
      {"key is a fifo", "worker --key " + fifo_key + " --listen tcp://127.0.0.1:1", "not a regular file"},
      {"cluster is a fifo", "run --model " + bert + " --ids 1,2 --cluster " + fifo_key + " --insecure", "not a regular file"},
  };
  for (const auto& c : cases) {
    const CmdResult r = run(c.args);
    EXPECT_FALSE(r.signaled) << c.what << ": crashed";
    EXPECT_NE(r.code, 0) << c.what;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << c.what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.what << ": " << r.err;
    EXPECT_NE(r.err.find(c.message_part), std::string::npos) << c.what << ": " << r.err;
  }
  ::unlink(fifo_key.c_str());
}

const std::string kBenchHeader =
    "model,strategy,devices,threads,cpus_per_device,secure,link,bandwidth_mbit,seq,reps,median_ms,min_ms,"
    "max_bytes_sent,bytes_sent_per_rank,compute_ms_rank0,comm_ms_rank0,compute_ms_max,comm_ms_max,status";

// The CSV's rows as column -> value (the test's links and statuses hold no
// quoted commas).
std::vector<std::map<std::string, std::string>> bench_rows(const std::string& text) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream in(text);
  std::string line, field;
  std::getline(in, line);
  std::vector<std::string> cols;
  for (std::istringstream h(line); std::getline(h, field, ',');) cols.push_back(field);
  while (std::getline(in, line)) {
    std::map<std::string, std::string> r;
    std::istringstream l(line);
    for (const auto& c : cols) {
      std::getline(l, field, ',');
      r[c] = field;
    }
    rows.push_back(r);
  }
  return rows;
}

TEST(CliTest, BenchSweepsWritesCsvAndResumes) {
  const std::string model = tmp("bert"), csv = tmp("bench.csv");
  auto r = run("gen-model --preset bert-base --layers 2 --hidden 64 --heads 4 --vocab 512 --out " + model);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string cmd = "bench --model " + model +
                          " --strategies single,tp,voltage --devices 1,2 --link 1gbit --reps 1 --warmup 0 --seq 8"
                          " --timeout 30 --out " + csv;
  r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[6/6] voltage K=2 1gbit"), std::string::npos) << r.err;
  const std::string first = core::read_file(csv).value();
  EXPECT_EQ(first.substr(0, first.find('\n')), kBenchHeader);
  const auto rows = bench_rows(first);
  ASSERT_EQ(rows.size(), 6u) << first;
  std::set<std::string> seen;
  for (const auto& row : rows) {
    const std::string what = row.at("strategy") + " K=" + row.at("devices");
    seen.insert(what);
    EXPECT_EQ(row.at("link"), "1gbit");
    EXPECT_EQ(row.at("seq"), "8");
    if (what == "single K=2") {
      EXPECT_EQ(row.at("status").rfind("skipped: ", 0), 0u) << row.at("status");
      EXPECT_EQ(row.at("median_ms"), "");
      continue;
    }
    EXPECT_EQ(row.at("status"), "ok") << what;
    EXPECT_GT(std::stod(row.at("median_ms")), 0.0) << what;
    EXPECT_LE(std::stod(row.at("min_ms")), std::stod(row.at("median_ms"))) << what;
    // One device sends nothing; two send the strategy's collectives.
    if (row.at("devices") == "1") {
      EXPECT_EQ(row.at("max_bytes_sent"), "0") << what;
    } else {
      EXPECT_GT(std::stod(row.at("max_bytes_sent")), 0.0) << what;
      EXPECT_EQ(std::count(row.at("bytes_sent_per_rank").begin(), row.at("bytes_sent_per_rank").end(), ';'), 1) << what;
    }
  }
  EXPECT_EQ(seen.size(), 6u);

  // The second run finds every row and reruns none.
  r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("0 run, 6 resumed"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 6) << r.err;
  EXPECT_EQ(core::read_file(csv).value(), first);
}

TEST(CliTest, BenchPlotOnlyDrawsSvgAndPng) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  const std::string stem = tmp("run");
  std::string csv = kBenchHeader + "\n";
  csv += "m,single,1,1,0,0,125mbit,125,8,1,10.0,9.0,0,0,10.0,0,10.0,0,ok\n";
  for (const char* s : {"tp", "voltage"})
    for (int k : {2, 3})
      for (const char* link : {"125mbit,125", "1gbit,1000"})
        csv += std::string("m,") + s + "," + std::to_string(k) + ",1,0,0," + link + ",8,1," + std::to_string(20 - k) +
               ",5,100,50;50,1,1,1,1,ok\n";
  csv += "m,tp,4,1,0,0,125mbit,125,8,1,,,,,,,,,skipped: too many devices\n";
  ASSERT_TRUE(core::write_file(stem + ".csv", csv).ok());
  auto r = run("bench --plot-only --out " + stem + ".csv");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* plot : {"-devices", "-bandwidth"}) {
    const std::string svg = core::read_file(stem + plot + ".svg").value();
    const std::string png = core::read_file(stem + plot + ".png").value();
    EXPECT_NE(svg.find("<svg"), std::string::npos) << plot;
    EXPECT_NE(svg.find("single device"), std::string::npos) << plot;
    EXPECT_NE(svg.find("voltage"), std::string::npos) << plot;
    EXPECT_EQ(png.substr(0, 4), "\x89PNG") << plot;
    EXPECT_GT(png.size(), 1000u) << plot;
  }
  r = run("bench --plot-only --out " + tmp("missing.csv"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
}

}  // namespace
}  // namespace tessera
