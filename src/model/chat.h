// What a chat needs beside its template (model/chat_template.h): the ids
// that end the assistant's turn, and the prompt's ids with exactly one BOS.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/tokenizer.h"

namespace tessera::model {

// The model's end-of-generation ids (ModelConfig::eos_token_ids: config.json
// and generation_config.json) and the id of the chat template's eos_token
// (tokenizer_config.json) when the tokenizer knows it; sorted, no repeats.
std::vector<int64_t> end_of_turn_ids(const ModelConfig& c, const Tokenizer* tok, const std::string& template_eos);

// A rendered chat prompt as ids: the tokenizer's special tokens added (its
// post-processor's BOS), and a BOS the template wrote as well dropped, so
// that the prompt starts with one BOS at most.
[[nodiscard]] core::Result<std::vector<int64_t>> chat_prompt_ids(const Tokenizer& tok, const std::string& rendered,
                                                                 const std::string& bos_token);

}  // namespace tessera::model
