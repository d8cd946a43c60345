// `tessera chat` (an interactive conversation) and `tessera run --chat`
// (one turn): the model's chat template, generation on one device or on a
// deployment over several, the answer streamed as it is produced.
#pragma once

#include <memory>
#include <string>

#include "cli/plan_flags.h"
#include "model/generate.h"
#include "runtime/deployment.h"

namespace tessera::cli {

struct ChatFlags {
  runtime::ClusterOptions cluster;
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
  model::GenerateOptions gen;  // sampling; max_new_tokens < 0: up to the end of the context
  int64_t timeout_s = 60;
  std::string system;          // a system message opening every conversation
  bool show_prompt = false;    // each rendered prompt to stderr
};

// `run --chat TEXT`: one user turn, the answer on stdout. 0 or fail()'s code.
int run_chat_turn(ChatFlags& f, const std::string& text);

}  // namespace tessera::cli
