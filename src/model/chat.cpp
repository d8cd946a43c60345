#include "model/chat.h"

#include <algorithm>


namespace tessera::model {

using core::Result;

std::vector<int64_t> end_of_turn_ids(const ModelConfig& c, const Tokenizer* tok, const std::string& template_eos) {
  std::vector<int64_t> ids = c.eos_token_ids;
  if (c.eos_token_id >= 0 && (c.vocab <= 0 || c.eos_token_id < c.vocab)) ids.push_back(c.eos_token_id);
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
