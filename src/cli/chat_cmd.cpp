#include "cli/chat_cmd.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "cli/cluster_flags.h"
#include "cli/commands.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "model/chat.h"
#include "model/generate.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "runtime/session.h"

namespace tessera::cli {

namespace {

using core::Result;
using core::Status;
using nlohmann::json;

// The model a conversation runs on: in this process for one plain device,
// else a session over the deployment the flags describe.
class Chatter {
 public:
  static Result<std::unique_ptr<Chatter>> open(ChatFlags& f) {
    auto c = std::unique_ptr<Chatter>(new Chatter());
    const std::string& dir = f.cluster.model_dir;
    TESSERA_ASSIGN_OR_RETURN(c->config_, model::load_config(dir));
    TESSERA_ASSIGN_OR_RETURN(c->tok_, model::load_tokenizer(dir));
    TESSERA_ASSIGN_OR_RETURN(model::ChatTemplate t, model::ChatTemplate::load(dir));
    c->template_ = std::make_unique<model::ChatTemplate>(std::move(t));
    c->stop_ids_ = model::end_of_turn_ids(c->config_, c->tok_.get(), c->template_->eos_token());
    f.cluster.devices = f.plan->devices;
    f.cluster.timeout_ms = f.timeout_s * 1000;
    if (runtime::runs_in_process(f.cluster, f.plan->strategy)) {
      TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(dir));
      c->model_ = std::make_unique<model::Transformer>(std::move(m));
      c->local_ = std::make_unique<model::CachingGenerator>(*c->model_);
      kernels::set_blas_threads(f.cluster.threads_per_device);
      c->pool_ = std::make_unique<core::ThreadPool>(f.cluster.threads_per_device);
      return c;
    }
    TESSERA_ASSIGN_OR_RETURN(runtime::Cluster cluster, runtime::Cluster::open(f.cluster));
    runtime::DeployRequest r;
    r.lossy = f.plan->lossy;
    r.max_loss = f.plan->max_loss;
    r.calibration = f.plan->calibration;
    if (f.plan->strategy == "auto") {
      TESSERA_ASSIGN_OR_RETURN(r.plan, auto_plan(*f.plan));
    } else {
      TESSERA_ASSIGN_OR_RETURN(r.plan, build_plan(*f.plan, f.plan->strategy, cluster.size(), true));
    }
    r.rows = 0;  // planned as serve plans (plan_rows' default); budgets at the model's longest input
    r.ctx_size = model::context_size(c->config_, f.gen);
    r.kv_dtype = f.gen.kv_dtype;
    // auto prices an answer's decode steps: --max-new-tokens, or 128 when
    // answers run to the end of the turn.
    r.new_tokens = f.gen.max_new_tokens > 0 ? f.gen.max_new_tokens : 128;
    TESSERA_ASSIGN_OR_RETURN(runtime::Deployment d, runtime::deploy(cluster, c->config_, r));
    d.session.budget_rows = 0;
    d.session.prefix_slots = 1;  // each turn's prompt starts with the last turn's tokens
    TESSERA_ASSIGN_OR_RETURN(c->session_, runtime::Session::start(d.session));
    return c;
  }

  // One assistant turn after `messages`: the text streamed to stdout as it
  // comes (never half a UTF-8 character), returned whole.
  Result<std::string> turn(const json& messages, const model::GenerateOptions& base, bool show_prompt) {
    TESSERA_ASSIGN_OR_RETURN(const std::string prompt, template_->render(messages, true));
    if (show_prompt) std::fprintf(stderr, "[prompt]%s[/prompt]\n", prompt.c_str());
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, model::chat_prompt_ids(*tok_, prompt, template_->bos_token()));
    const int64_t ctx = model::context_size(config_, base);
    const auto room = ctx - static_cast<int64_t>(ids.size());
    if (room < 1)
      return core::out_of_range("the conversation's " + std::to_string(ids.size()) + " tokens fill the context of " +
                                std::to_string(ctx) + " positions (--ctx-size): /reset to start again");
    model::GenerateOptions o = base;
    o.max_new_tokens = base.max_new_tokens < 0 ? room : std::min(base.max_new_tokens, room);
    o.eos_token_id = -1;  // the end-of-turn ids below stop it
    model::StreamDecoder decoder(*tok_);  // releases whole characters only
    std::string text;
    bool ended = false;
    o.on_token = [&](int64_t id) {
      if (std::binary_search(stop_ids_.begin(), stop_ids_.end(), id)) {
        ended = true;
        return;
      }
      auto piece = decoder.step(id);
      if (!piece.ok() || piece->empty()) return;
      text += *piece;
      std::fwrite(piece->data(), 1, piece->size(), stdout);
      std::fflush(stdout);
    };
    o.stop_requested = [&] { return ended; };
    // On one device the caches stay between turns (CachingGenerator), as the
    // session's prefix cache keeps them across devices: a turn prefills only
    // what the last one did not.
    auto seq = local_ ? local_->generate(ids, o, pool_.get()) : session_->generate(ids, o);
    TESSERA_RETURN_IF_ERROR(seq.status());
    if (auto tail = decoder.flush(); tail.ok() && !tail->empty()) {
      text += *tail;
      std::fwrite(tail->data(), 1, tail->size(), stdout);
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    return text;
  }

 private:
  Chatter() = default;

  model::ModelConfig config_;
  std::unique_ptr<model::Tokenizer> tok_;
  std::unique_ptr<model::ChatTemplate> template_;
  std::vector<int64_t> stop_ids_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<core::ThreadPool> pool_;
  std::unique_ptr<runtime::Session> session_;
  std::unique_ptr<model::CachingGenerator> local_;  // over model_
};

json opening(const ChatFlags& f) {
  json m = json::array();
  if (!f.system.empty()) m.push_back({{"role", "system"}, {"content", f.system}});
  return m;
}

// The conversation: a line is a user turn; /reset starts again, /exit (or
// the end of input) leaves.
int chat_loop(ChatFlags& f) {
  if (const auto st = model::validate_generate_options(f.gen); !st.ok() && f.gen.max_new_tokens >= 0) return fail(st.to_string());
  auto chatter = Chatter::open(f);
  if (!chatter.ok()) return fail(chatter.status().to_string());
  json messages = opening(f);
  std::printf("tessera chat: %s (/reset starts again, /exit leaves)\n", f.cluster.model_dir.c_str());
  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages = opening(f);
      std::puts("(conversation reset)");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto answer = (*chatter)->turn(messages, f.gen, f.show_prompt);
    if (!answer.ok()) {
      messages.erase(messages.size() - 1);  // the turn did not happen
      std::fprintf(stderr, "error: %s\n", answer.status().to_string().c_str());
      continue;
    }
    messages.push_back({{"role", "assistant"}, {"content", *answer}});
  }
  std::puts("");
  return 0;
}

}  // namespace

int run_chat_turn(ChatFlags& f, const std::string& text) {
  auto chatter = Chatter::open(f);
  if (!chatter.ok()) return fail(chatter.status().to_string());
  json messages = opening(f);
  messages.push_back({{"role", "user"}, {"content", text}});
  auto answer = (*chatter)->turn(messages, f.gen, f.show_prompt);
  return answer.ok() ? 0 : fail(answer.status().to_string());
}

void add_chat_flags(CLI::App* cmd, ChatFlags& f) {
  cmd->add_option("--system", f.system, "a system message opening the conversation");
  cmd->add_option("--max-tokens", f.gen.max_new_tokens, "new tokens per answer at most (default: up to the context)");
  cmd->add_flag("--greedy", f.gen.greedy, "greedy decoding (default samples)");
  cmd->add_option("--temperature", f.gen.temperature, "sampling temperature")->capture_default_str();
  cmd->add_option("--top-k", f.gen.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", f.gen.top_p, "nucleus sampling threshold")->capture_default_str();
  cmd->add_option("--seed", f.gen.seed, "sampling seed")->capture_default_str();
  cmd->add_flag("--show-prompt", f.show_prompt, "print each rendered prompt to stderr");
  add_context_flags(cmd, f.gen.ctx_size, f.gen.kv_dtype);
}

void add_chat_command(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  f->gen.max_new_tokens = -1;
  f->gen.greedy = false;
  CLI::App* cmd = app.add_subcommand("chat", "an interactive chat with the model's chat template (/reset, /exit)");
  cmd->add_option("--model", f->cluster.model_dir, "Hugging Face model folder with a chat template")->required();
  add_plan_flags(cmd, f->plan);
  add_lossy_flag(cmd, f->plan);
  add_cluster_flags(cmd, f->cluster, f->timeout_s);
  add_chat_flags(cmd, *f);
  cmd->callback([f] { throw CLI::RuntimeError(chat_loop(*f)); });
}


}  // namespace tessera::cli
