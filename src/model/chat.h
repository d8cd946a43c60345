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

// The config's eos_token_id, every id of generation_config.json's
// eos_token_id (a number or a list), and the id of the chat template's
// eos_token (tokenizer_config.json) when the tokenizer knows it; sorted,
// without repeats; ids outside the vocabulary are left out. Files that are
// absent add nothing; a malformed generation_config.json is an error.
[[nodiscard]] core::Result<std::vector<int64_t>> end_of_turn_ids(const std::string& dir, const ModelConfig& c,
                                                                 const Tokenizer* tok, const std::string& template_eos);

// A rendered chat prompt as ids: the tokenizer's special tokens added (its
// post-processor's BOS), and a BOS the template wrote as well dropped, so
// that the prompt starts with one BOS at most.
[[nodiscard]] core::Result<std::vector<int64_t>> chat_prompt_ids(const Tokenizer& tok, const std::string& rendered,
                                                                 const std::string& bos_token);

}  // namespace tessera::model
