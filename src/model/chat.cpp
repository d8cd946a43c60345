#include "model/chat.h"

#include <algorithm>

#include "core/io.h"
#include "core/json.h"

namespace tessera::model {

using core::Result;
using nlohmann::json;

Result<std::vector<int64_t>> end_of_turn_ids(const std::string& dir, const ModelConfig& c, const Tokenizer* tok,
                                             const std::string& template_eos) {
  std::vector<int64_t> ids;
  if (c.eos_token_id >= 0 && (c.vocab <= 0 || c.eos_token_id < c.vocab)) ids.push_back(c.eos_token_id);
  const std::string path = dir + "/generation_config.json";
  if (core::file_exists(path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
    TESSERA_ASSIGN_OR_RETURN(const json j, core::parse_json(text, path));
    if (!j.is_object()) return core::parse_error(path + ": not a JSON object");
    if (const auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
      const json list = it->is_array() ? *it : json::array({*it});
      for (const json& v : list) {
        if (!v.is_number_integer()) return core::parse_error(path + ": eos_token_id must be token ids");
        // An id outside the vocabulary never comes out of the model (tiny
        // test models keep GPT-2's 50256 over 512 tokens): nothing to stop at.
        if (v.get<int64_t>() >= 0 && (c.vocab <= 0 || v.get<int64_t>() < c.vocab)) ids.push_back(v.get<int64_t>());
      }
    }
  }
  if (tok != nullptr && !template_eos.empty())
    if (const auto id = tok->token_to_id(template_eos)) ids.push_back(*id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Result<std::vector<int64_t>> chat_prompt_ids(const Tokenizer& tok, const std::string& rendered, const std::string& bos_token) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tok.encode(rendered, true));
  if (bos_token.empty()) return ids;
  const auto bos = tok.token_to_id(bos_token);
  if (bos && ids.size() >= 2 && ids[0] == *bos && ids[1] == *bos) ids.erase(ids.begin());
  return ids;
}

}  // namespace tessera::model
