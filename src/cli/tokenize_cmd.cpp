// `tessera tokenize`: a model folder's tokenizer (tokenizer.json, plus
// tokenizer_config.json when present; no weights, no config.json) on text.
//   --text T | --file F      one JSON line {"ids": [...], "tokens": [...]},
//                            special tokens added as HF does by default
//   --decode 1,2,3           one JSON line {"text": ...}
//   --jsonl F                batch: one JSON string per line in, one JSON line
//                            out: {"ids", "plain_ids" (no special tokens), "text"
//                            (plain_ids decoded, special tokens kept)} or {"error"}
//   --time                   with --text/--file: {"load_s", "encode_s", "bytes",
//                            "tokens"} instead of the ids (benchmarks)
// Errors (a bad file, an unsupported component, invalid UTF-8) are one line on
// stderr and exit code 1.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/io.h"
#include "model/tokenizer.h"

namespace tessera::cli {

namespace {

using Json = nlohmann::json;

struct TokenizeFlags {
  std::string model_dir, text, file, decode, jsonl;
  bool no_special = false, skip_special = false, time = false;
};

std::string one_line(std::string s) {
  for (auto& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

void print_line(const Json& j) {
  const std::string line = j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

core::Result<std::vector<int64_t>> parse_ids(const std::string& list) {
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    size_t used = 0;
    int64_t id = 0;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) return core::invalid_argument("--decode: '" + item + "' is not an id");
    ids.push_back(id);
    pos = end + 1;
  }
  return ids;
}

int run_jsonl(const model::Tokenizer& t, const TokenizeFlags& f) {
  std::ifstream in(f.jsonl, std::ios::binary);
  if (!in) return fail("cannot open '" + f.jsonl + "'");
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const Json input = Json::parse(line, nullptr, false);
    if (input.is_discarded() || !input.is_string()) return fail(f.jsonl + ": line " + std::to_string(n) + " is not a JSON string");
    const std::string s = input.get<std::string>();
    Json out = Json::object();
    auto ids = t.encode(s, true);
    auto plain = t.encode(s, false);
    if (!ids.ok() || !plain.ok()) {
      out["error"] = one_line((ids.ok() ? plain.status() : ids.status()).to_string());
    } else {
      out["ids"] = *ids;
      out["plain_ids"] = *plain;
      auto text = t.decode(*plain, false);
      if (text.ok()) {
        out["text"] = *text;
      } else {
        out["error"] = one_line(text.status().to_string());
      }
    }
    print_line(out);
  }
  std::fflush(stdout);
  return 0;
}

int tokenize(const TokenizeFlags& f) {
  const int modes = !f.text.empty() + !f.file.empty() + !f.decode.empty() + !f.jsonl.empty();
  if (modes != 1) return fail("tokenize: give exactly one of --text, --file, --decode, --jsonl");
  const auto t0 = std::chrono::steady_clock::now();
  auto tokenizer = model::load_tokenizer(f.model_dir);
  if (!tokenizer.ok()) return fail(one_line(tokenizer.status().to_string()));
  const auto t1 = std::chrono::steady_clock::now();
  const model::Tokenizer& t = **tokenizer;
  if (!f.jsonl.empty()) return run_jsonl(t, f);
  if (!f.decode.empty()) {
    auto ids = parse_ids(f.decode);
    if (!ids.ok()) return fail(ids.status().to_string());
    auto text = t.decode(*ids, f.skip_special);
    if (!text.ok()) return fail(one_line(text.status().to_string()));
    print_line(Json{{"text", *text}});
    return 0;
  }
  std::string text = f.text;
  if (!f.file.empty()) {
    auto read = core::read_file(f.file);
    if (!read.ok()) return fail(one_line(read.status().to_string()));
    text = std::move(read).value();
  }
  const auto t2 = std::chrono::steady_clock::now();
  auto ids = t.encode(text, !f.no_special);
  const auto t3 = std::chrono::steady_clock::now();
  if (!ids.ok()) return fail(one_line(ids.status().to_string()));
  if (f.time) {
    const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
    print_line(Json{{"load_s", seconds(t1 - t0)}, {"encode_s", seconds(t3 - t2)}, {"bytes", text.size()},
                    {"tokens", ids->size()}});
    return 0;
  }
  auto tokens = t.id_to_tokens(*ids);
  if (!tokens.ok()) return fail(one_line(tokens.status().to_string()));
  print_line(Json{{"ids", *ids}, {"tokens", *tokens}});
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand("tokenize", "text -> token ids with the model's tokenizer, or ids -> text (no weights needed)");
  cmd->add_option("--model", f->model_dir, "folder with tokenizer.json (and tokenizer_config.json)")->required();
  cmd->add_option("--text", f->text, "text to encode");
  cmd->add_option("--file", f->file, "file whose bytes are the text to encode");
  cmd->add_option("--decode", f->decode, "comma-separated ids to decode");
  cmd->add_option("--jsonl", f->jsonl, "batch: one JSON string per line; prints one JSON line each");
  cmd->add_flag("--no-special", f->no_special, "do not add the post-processor's special tokens (BOS/EOS)");
  cmd->add_flag("--skip-special", f->skip_special, "--decode: drop special tokens");
  cmd->add_flag("--time", f->time, "print load and encode seconds instead of the ids");
  cmd->callback([f] { throw CLI::RuntimeError(tokenize(*f)); });
}

}  // namespace tessera::cli
