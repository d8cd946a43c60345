// Single-device commands: run, generate, bench-local, gen-model.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>

#include "cli/chat_cmd.h"
#include "cli/cluster_flags.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "core/stats.h"
#include "core/io.h"
#include "core/logging.h"
#include "kernels/gemm.h"
#include "kernels/simd.h"
#include "model/gen_model.h"
#include "model/generate.h"
#include "model/gguf_model.h"
#include "model/tokenizer.h"
#include "parallel/strategy.h"
#include "runtime/deployment.h"
#include "runtime/single_device.h"

namespace tessera::cli {

namespace {

struct RunFlags {
  runtime::RunRequest req;
  runtime::ClusterOptions cluster;
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
  bool stats = false;
  int64_t timeout_s = 60;
  int reps = 1;
  int warmup = 0;
  std::string ids, token_types;
  bool json = false;
  int64_t generate = 0;
  bool greedy = false;
  std::string chat;  // run --chat: one user turn through the chat template
};

void add_input_options(CLI::App* cmd, RunFlags& f) {
  cmd->add_option("--model", f.req.model_dir, "Hugging Face model folder")->required();
  cmd->add_option("--text", f.req.text, "input text (tokenized with the model's tokenizer)");
  cmd->add_option("--ids", f.ids, "token ids, comma-separated");
  cmd->add_option("--token-types", f.token_types, "BERT token type ids, comma-separated");
  cmd->add_option("--image", f.req.image_path, "PNG or JPEG image (ViT)");
  cmd->add_option("--pixels", f.req.pixels_path, "safetensors with pixel_values [1,3,H,W] (ViT)");
  cmd->add_option("--threads", f.req.threads, "compute threads")->capture_default_str();
}

int finish_parse(RunFlags& f) {
  if (f.generate < 0) return fail("--generate / --max-new-tokens must be >= 0");
  if (const auto st = model::validate_generate_options(f.req.gen); !st.ok()) return fail(st.to_string());
  if (!f.ids.empty()) {
    auto ids = runtime::parse_id_list(f.ids);
    if (!ids.ok()) return fail(ids.status().to_string());
    f.req.ids = *ids;
  }
  if (!f.token_types.empty()) {
    auto tt = runtime::parse_id_list(f.token_types);
    if (!tt.ok()) return fail(tt.status().to_string());
    f.req.token_types = *tt;
  }
  return 0;
}

// Adds to the session's figures what each device computed (GEMM and
// attention GFLOPs of the layers, from the strategy's estimate) and sent per
// layer (all its bytes over the layers, including the terminal's first
// distribution and the final gather).
nlohmann::json with_work_figures(const runtime::Session& s) {
  nlohmann::json j = s.last_stats();
  auto sched = parallel::estimate(s.plan(), s.model().config(), j["rows"].get<int64_t>());
  const double layers = static_cast<double>(std::max<int64_t>(s.model().config().layers, 1));
  for (auto& r : j["ranks"]) {
    const int rank = r["rank"].get<int>();
    if (sched.ok() && rank >= 0 && rank < static_cast<int>(sched->devices.size()))
      r["gflops"] = sched->devices[static_cast<size_t>(rank)].flops() / 1e9;
    r["bytes_per_layer"] = r["bytes_sent"].get<double>() / layers;
  }
  return j;
}

// Generation on a session: the median run by ms per token is reported
// (--stats), the ids (`ids_only`, as `tessera generate` prints them) or the
// run's usual output.
int generate_distributed(runtime::Session& s, const RunFlags& f, bool ids_only,
                         const std::optional<planner::Candidate>& chosen, const std::vector<int>& members) {
  auto in = runtime::build_input(s.model(), f.req);
  if (!in.ok()) return fail(in.status().to_string());
  model::GenerateOptions g = f.req.gen;
  g.max_new_tokens = f.generate;
  for (int i = 0; i < f.warmup; ++i)
    if (auto w = s.generate(in->ids, g); !w.ok()) return fail(w.status().to_string());
  std::vector<double> per_token;
  std::vector<nlohmann::json> figures;
  core::Result<std::vector<int64_t>> seq = core::internal_error("no run");
  core::Timer timer;
  for (int i = 0; i < f.reps; ++i) {
    timer.reset();
    seq = s.generate(in->ids, g);
    if (!seq.ok()) return fail(seq.status().to_string());
    figures.push_back(s.last_stats());
    per_token.push_back(figures.back().value("ms_per_token", 0.0));
  }
  runtime::RunResult r;
  r.config = s.model().config();
  r.input_ids = in->ids;
  r.generated.assign(seq->begin() + static_cast<std::ptrdiff_t>(in->ids.size()), seq->end());
  r.latency_ms = timer.ms();
  if (auto tok = model::load_tokenizer(f.req.model_dir); tok.ok())
    if (auto text = (*tok)->decode(r.generated, true); text.ok()) r.generated_text = *text;
  if (f.stats) {
    nlohmann::json j = figures.empty() ? nlohmann::json::object() : figures[core::median_index(per_token)];
    // The planner's count of each rank's memory (weights, the prompt's
    // activations, KV caches at the context) beside the measured ranks[].memory_bytes.
    const auto& c = s.model().config();
    if (auto p = runtime::predicted_memory(s.plan(), c, static_cast<int64_t>(in->ids.size()), model::context_size(c, g),
                                           g.kv_dtype);
        p.ok())
      j["predicted_memory_bytes"] = *p;
    j["ctx_size"] = model::context_size(c, g);
    j["reps"] = f.reps;
    j["ms_per_token_median"] = core::median(per_token);
    // auto's prediction beside the measured prefill_ms and ms_per_token.
    if (chosen) {
      j["predicted_ttft_ms"] = chosen->prediction.latency_ms;
      j["predicted_ms_per_token"] = chosen->step_ms > 0 ? nlohmann::json(chosen->step_ms) : nlohmann::json(nullptr);
    }
    j["members"] = members;  // the cluster's devices in rank order: a pair decodes on the first
    j["generated_ids"] = r.generated;
    std::cout << j.dump() << '\n';
  } else if (ids_only) {
    for (size_t i = 0; i < r.generated.size(); ++i) std::cout << (i ? "," : "") << r.generated[i];
    std::cout << '\n';
  } else if (f.json) {
    std::cout << runtime::to_json(r).dump() << '\n';
  } else {
    std::cout << runtime::format_human(r);
  }
  return 0;
}

int run_distributed(RunFlags& f, bool ids_only = false) {
  if (f.reps < 1 || f.warmup < 0) return fail("--reps must be >= 1 and --warmup >= 0");
  f.cluster.model_dir = f.req.model_dir;
  f.cluster.timeout_ms = int64_t{f.timeout_s} * 1000;
  f.cluster.devices = f.plan->devices;
  auto cluster = runtime::Cluster::open(f.cluster);
  if (!cluster.ok()) return fail(cluster.status().to_string());
  auto c = model::load_config(f.req.model_dir);
  if (!c.ok()) return fail(c.status().to_string());
  // The planner prices, and every rank loads, this type (a quantized GGUF
  // keeps its own unless --quantize names one).
  if (f.req.weights != kernels::WeightType::kF32) c->weights = f.req.weights;
  auto rows = runtime::request_rows(f.req.model_dir, *c, f.req.text, f.req.ids.size());
  if (!rows.ok()) return fail(rows.status().to_string());
  runtime::DeployRequest dr;
  dr.rows = *rows;  // planned for, and budgets checked at, this request's rows
  if (f.generate > 0) {
    dr.ctx_size = model::context_size(*c, f.req.gen);
    dr.new_tokens = f.generate;
  }
  dr.kv_dtype = f.req.gen.kv_dtype;
  dr.lossy = f.plan->lossy;
  dr.max_loss = f.plan->max_loss;
  dr.calibration = f.plan->calibration;
  if (f.plan->strategy == "auto") {
    auto plan = auto_plan(*f.plan);
    if (!plan.ok()) return fail(plan.status().to_string());
    dr.plan = *plan;
  } else {
    auto plan = build_plan(*f.plan, f.plan->strategy, cluster->size(), true);
    if (!plan.ok()) return fail(plan.status().to_string());
    dr.plan = *plan;
  }
  auto deployment = runtime::deploy(*cluster, *c, dr);
  if (!deployment.ok()) return fail(deployment.status().to_string());
  const std::optional<planner::Candidate>& chosen = deployment->chosen;
  auto session = runtime::Session::start(deployment->session);
  if (!session.ok()) return fail(session.status().to_string());
  if (f.generate > 0) return generate_distributed(**session, f, ids_only, chosen, deployment->members);
  for (int i = 0; i < f.warmup; ++i)
    if (auto w = (*session)->run(f.req); !w.ok()) return fail(w.status().to_string());
  // Timed runs: the figures reported are those of the median-latency run.
  std::vector<double> latencies;
  std::vector<nlohmann::json> figures;
  core::Result<runtime::RunResult> r = core::internal_error("no run");
  for (int i = 0; i < f.reps; ++i) {
    r = (*session)->run(f.req);
    if (!r.ok()) return fail(r.status().to_string());
    figures.push_back(with_work_figures(**session));
    latencies.push_back(figures.back()["latency_ms"].get<double>());
  }
  if (f.stats) {
    nlohmann::json j = figures[core::median_index(latencies)];
    j["reps"] = f.reps;
    j["latency_median_ms"] = core::median(latencies);
    j["latency_min_ms"] = *std::min_element(latencies.begin(), latencies.end());
    j["latency_max_ms"] = *std::max_element(latencies.begin(), latencies.end());
    if (chosen) {
      j["predicted_ms"] = chosen->prediction.latency_ms;
      j["planner"] = deployment->planner_json();
    }
    std::cout << j.dump() << '\n';
  } else if (f.json) {
    std::cout << runtime::to_json(*r).dump() << '\n';
  } else {
    if (chosen) {
      const parallel::Plan& p = deployment->plan;
      std::cout << "plan: " << p.strategy;
      if (p.weights != kernels::WeightType::kF32) std::cout << " weights=" << kernels::weight_type_name(p.weights);
      if (p.wire != core::WireType::kF32) std::cout << " wire=" << core::wire_type_name(p.wire);
      // A lossy strategy's setting (PRISM's rate), as `plan` prints it.
      if (const auto* s = parallel::find_strategy(p.strategy); s != nullptr && !s->exact() && p.options.is_object())
        for (const auto& [k, v] : p.options.items())
          if (!v.is_array() && !v.is_object()) std::cout << ' ' << k << '=' << v.dump();
      std::cout << " on " << p.world << " device(s), predicted " << chosen->prediction.latency_ms << " ms";
      if (chosen->measured_loss >= 0)
        std::cout << ", measured top-1 disagreement " << 100.0 * chosen->measured_loss << "% (--max-loss "
                  << 100.0 * f.plan->max_loss << "%)";
      std::cout << '\n';
    }
    r->latency_ms = core::median(latencies);
    std::cout << runtime::format_human(*r);
    if (f.reps > 1) std::cout << "(median of " << f.reps << " runs)\n";
  }
  return 0;
}

int run_command(RunFlags& f) {
  if (int rc = finish_parse(f)) return rc;
  // Checked in seconds, before the conversion to milliseconds.
  if (f.timeout_s < 1 || f.timeout_s > 86400) return fail("--timeout must be between 1 and 86400 seconds");
  f.req.gen.greedy = f.greedy || f.req.gen.greedy;
  if (!f.chat.empty()) {
    ChatFlags c;
    c.cluster = f.cluster;
    c.cluster.model_dir = f.req.model_dir;
    c.plan = f.plan;
    c.gen = f.req.gen;
    c.gen.max_new_tokens = f.generate > 0 ? f.generate : -1;  // --generate caps the answer
    c.timeout_s = f.timeout_s;
    return run_chat_turn(c, f.chat);
  }
  // A memory budget or an emulated speed is honoured by a session, also for one device.
  f.cluster.devices = f.plan->devices;
  if (!runtime::runs_in_process(f.cluster, f.plan->strategy)) return run_distributed(f);
  f.req.generate_tokens = f.generate;
  auto r = runtime::run_single(f.req);
  if (!r.ok()) return fail(r.status().to_string());
  if (f.json) {
    std::cout << runtime::to_json(*r).dump() << '\n';
  } else {
    std::cout << runtime::format_human(*r);
  }
  return 0;
}

void add_distributed_options(CLI::App* cmd, const std::shared_ptr<RunFlags>& f);


void add_run(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("run", "run one inference");
  add_input_options(cmd, *f);
  cmd->add_option("--dump", f->req.dump_path, "write logits and hidden.L to a safetensors file");
  cmd->add_flag("--json", f->json, "machine-readable output");
  cmd->add_option("--generate", f->generate, "GPT-2: generate N new tokens");
  cmd->add_option("--chat", f->chat, "one chat turn: this user message through the model's chat template (the answer is printed)");
  cmd->add_flag("--greedy", f->greedy, "greedy decoding (default samples with --top-k/--top-p)");
  cmd->add_option("--top-k", f->req.gen.top_k, "sample from the k most likely tokens");
  cmd->add_option("--top-p", f->req.gen.top_p, "nucleus sampling threshold");
  cmd->add_option("--temperature", f->req.gen.temperature, "sampling temperature");
  cmd->add_option("--seed", f->req.gen.seed, "sampling seed");
  add_context_flags(cmd, f->req.gen.ctx_size, f->req.gen.kv_dtype);
  f->req.gen.greedy = false;
  add_distributed_options(cmd, f);
  cmd->callback([f] { throw CLI::RuntimeError(run_command(*f)); });
}

void add_distributed_options(CLI::App* cmd, const std::shared_ptr<RunFlags>& f) {
  add_plan_flags(cmd, f->plan);
  add_lossy_flag(cmd, f->plan);
  add_cluster_flags(cmd, f->cluster, f->timeout_s);
  add_quantize_flag(cmd, f->req.weights);
  cmd->add_flag("--stats", f->stats, "print per-rank latency, compute, communication and weight figures as JSON");
  cmd->add_option("--reps", f->reps, "distributed: timed runs (--stats reports the median)")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "distributed: untimed runs first")->capture_default_str();
}

void add_generate(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "GPT-2 generation; prints the generated ids, comma-separated");
  add_input_options(cmd, *f);
  cmd->add_option("--max-new-tokens", f->generate, "new tokens")->required();
  cmd->add_flag("--greedy", f->greedy, "greedy decoding");
  cmd->add_option("--top-k", f->req.gen.top_k, "sample from the k most likely tokens");
  cmd->add_option("--top-p", f->req.gen.top_p, "nucleus sampling threshold");
  cmd->add_option("--temperature", f->req.gen.temperature, "sampling temperature");
  cmd->add_option("--seed", f->req.gen.seed, "sampling seed");
  add_context_flags(cmd, f->req.gen.ctx_size, f->req.gen.kv_dtype);
  add_distributed_options(cmd, f);
  cmd->callback([f] {
    int rc = finish_parse(*f);
    f->cluster.devices = f->plan->devices;
    if (rc == 0 && !runtime::runs_in_process(f->cluster, f->plan->strategy)) {
      if (f->timeout_s < 1 || f->timeout_s > 86400) throw CLI::RuntimeError(fail("--timeout must be between 1 and 86400 seconds"));
      f->req.gen.greedy = f->greedy;
      throw CLI::RuntimeError(run_distributed(*f, true));
    }
    if (rc == 0) {
      f->req.generate_tokens = f->generate;
      f->req.gen.greedy = f->greedy;
      auto r = runtime::run_single(f->req);
      if (!r.ok()) {
        rc = fail(r.status().to_string());
      } else {
        for (size_t i = 0; i < r->generated.size(); ++i) std::cout << (i ? "," : "") << r->generated[i];
        std::cout << '\n';
      }
    }
    throw CLI::RuntimeError(rc);
  });
}

struct BenchFlags {
  std::string model;
  int64_t seq = 128;
  int threads = 1;
  int reps = 10;
  int warmup = 2;
  bool json = false;
  int64_t generate = 0;  // GPT-2: greedy decode steps after a --seq prompt
  int64_t ctx_size = 0;
  core::DType kv_dtype = core::DType::kF32;
  kernels::WeightType weights = kernels::WeightType::kF32;
};

// GPT-2 decode: a --seq-token prompt, then b.generate greedy tokens, reps
// times; the median of the per-token intervals after the first token (one
// decode step each: one row through every layer and the LM head).
int bench_decode(const model::Transformer& m, const BenchFlags& b, const model::ModelInput& in, core::ThreadPool* pool) {
  const auto& c = m.config();
  if (!c.causal_lm()) return fail("--generate needs a causal LM with its head");
  // The context ends a generation early; the figures would then cover fewer tokens than asked.
  if (b.seq + b.generate > model::context_size(c, b.ctx_size))
    return fail("--seq + --generate exceeds the context of " + std::to_string(model::context_size(c, b.ctx_size)) +
                " positions (--ctx-size; at most max_position_embeddings)");
  std::vector<double> steps;
  for (int i = 0; i < b.warmup + b.reps; ++i) {
    model::GenerateOptions o;
    o.max_new_tokens = b.generate;
    o.ctx_size = b.ctx_size;
    o.kv_dtype = b.kv_dtype;
    o.greedy = true;
    o.eos_token_id = -1;
    core::Timer t;
    double last = -1.0;
    int64_t produced = 0;
    o.on_token = [&](int64_t) {
      const double now = t.ms();
      if (last >= 0.0 && i >= b.warmup) steps.push_back(now - last);
      last = now;
      ++produced;
    };
    auto r = model::generate(m, in.ids, o, pool);
    if (!r.ok()) return fail(r.status().to_string());
    if (produced != b.generate) return fail("generation stopped early");
  }
  if (steps.empty()) return fail("--generate must be >= 2");
  std::sort(steps.begin(), steps.end());
  const double median = steps[steps.size() / 2];
  // Weights one decode step reads: every layer's matrices and the LM head.
  size_t bytes = m.weights().lm_head_w.nbytes();
  for (const auto& l : m.weights().layers)
    for (const kernels::PackedLinear* w : {&l.qkv_w, &l.attn_out_w, &l.ffn_in_w, &l.ffn_out_w}) bytes += w->nbytes();
  if (b.json) {
    nlohmann::json j = {{"model", b.model}, {"prompt", b.seq}, {"new_tokens", b.generate}, {"threads", b.threads},
                        {"reps", b.reps}, {"decode_ms_per_token", median}, {"min_ms", steps.front()},
                        {"weight_bytes_per_token", bytes}, {"gemm", kernels::gemm_path_name(kernels::gemm_path())},
                        {"weights", kernels::weight_type_name(b.weights)},
                        {"isa", kernels::isa_name(kernels::best_isa())}};
    std::cout << j.dump() << '\n';
  } else {
    std::printf("%s decode prompt=%lld new=%lld threads=%d median=%.3f ms/token min=%.3f weights/token=%.1f MB\n",
                m.config().family.c_str(), static_cast<long long>(b.seq), static_cast<long long>(b.generate), b.threads, median, steps.front(),
                static_cast<double>(bytes) / 1e6);
  }
  return 0;
}

int bench_local(const BenchFlags& b) {
  model::LoadOptions lo;
  lo.weights = b.weights;
  auto m = model::Transformer::load(b.model, lo);
  if (!m.ok()) return fail(m.status().to_string());
  if (b.threads < 1 || b.reps < 1) return fail("--threads and --reps must be >= 1");
  const auto& c = m->config();
  model::ModelInput in;
  std::mt19937_64 rng(1);
  if (c.takes_images()) {
    in.pixels = core::Tensor::zeros_f32({1, c.channels, c.image_size, c.image_size});
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < in.pixels.numel(); ++i) in.pixels.f32()[i] = nd(rng);
  } else {
    if (b.seq < 1 || b.seq > c.max_positions) return fail("--seq must be in [1, max_position_embeddings]");
    for (int64_t i = 0; i < b.seq; ++i) in.ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab)));
  }
  kernels::set_blas_threads(b.threads);
  core::ThreadPool pool(b.threads);
  if (b.generate > 0) return bench_decode(*m, b, in, &pool);
  std::vector<double> ms;
  model::Workspace ws;
  for (int i = 0; i < b.warmup + b.reps; ++i) {
    core::Timer t;
    auto out = m->forward(in, {}, &pool, ws);
    if (!out.ok()) return fail(out.status().to_string());
    if (i >= b.warmup) ms.push_back(t.ms());
  }
  const double median = core::median(ms);
  std::sort(ms.begin(), ms.end());
  const int64_t rows = c.takes_images() ? c.max_rows() : b.seq;
  if (b.json) {
    nlohmann::json j = {{"model", b.model}, {"model_type", c.family}, {"rows", rows},
                        {"threads", b.threads}, {"reps", b.reps}, {"median_ms", median}, {"min_ms", ms.front()},
                        {"max_ms", ms.back()}, {"weights", kernels::weight_type_name(b.weights)}};
    std::cout << j.dump() << '\n';
  } else {
    std::printf("%s rows=%lld threads=%d reps=%d median=%.2f ms min=%.2f ms max=%.2f ms\n", c.family.c_str(),
                static_cast<long long>(rows), b.threads, b.reps, median, ms.front(), ms.back());
  }
  return 0;
}

void add_bench_local(CLI::App& app) {
  auto b = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench-local", "single-device latency: median and min over repetitions");
  cmd->add_option("--model", b->model, "Hugging Face model folder")->required();
  cmd->add_option("--seq", b->seq, "sequence length (text models)")->capture_default_str();
  cmd->add_option("--threads", b->threads, "compute threads")->capture_default_str();
  cmd->add_option("--reps", b->reps, "timed repetitions")->capture_default_str();
  cmd->add_option("--warmup", b->warmup, "untimed repetitions first")->capture_default_str();
  cmd->add_flag("--json", b->json, "machine-readable output");
  cmd->add_option("--generate", b->generate,
                  "causal LMs: time greedy decoding of this many tokens after a --seq prompt (median ms per token)");
  add_context_flags(cmd, b->ctx_size, b->kv_dtype);
  add_quantize_flag(cmd, b->weights);
  cmd->callback([b] { throw CLI::RuntimeError(bench_local(*b)); });
}

void add_gen_model(CLI::App& app) {
  auto o = std::make_shared<model::GenModelOptions>();
  CLI::App* cmd = app.add_subcommand("gen-model", "write a Hugging Face model folder with seeded random weights");
  std::string presets;
  for (const auto& p : model::gen_model_presets()) presets += (presets.empty() ? "" : ", ") + p;
  cmd->add_option("--preset", o->preset, presets)->required();
  cmd->add_option("--out", o->out_dir, "output folder")->required();
  cmd->add_option("--layers", o->layers, "override the layer count");
  cmd->add_option("--hidden", o->hidden, "override the hidden size");
  cmd->add_option("--heads", o->heads, "override the head count");
  cmd->add_option("--vocab", o->vocab, "override the vocabulary size");
  cmd->add_option("--intermediate", o->intermediate, "override the FFN size (default: the preset's, or 4 x hidden)");
  cmd->add_option("--kv-heads", o->kv_heads, "override the K/V head count (Llama-style presets)");
  cmd->add_option("--head-dim", o->head_dim, "override the head size (Llama-style presets; default: the preset's, or hidden / heads)");
  cmd->add_option("--tokenizer", o->tokenizer_dir,
                  "copy tokenizer.json and tokenizer_config.json from this folder and size the vocabulary to them");
  cmd->add_option("--labels", o->labels, "override the number of classes");
  cmd->add_option("--seed", o->seed, "weight seed")->capture_default_str();
  cmd->add_option("--bp-div", o->bp_div, "a decoupled model (DeTransformer): N sub-blocks per decoupled layer");
  cmd->add_option("--bp-original", o->bp_original, "with --bp-div: the original layers, e.g. 2,5,8,11")->delimiter(',');
  cmd->callback([o] {
    const auto st = model::gen_model(*o);
    if (!st.ok()) throw CLI::RuntimeError(fail(st.to_string()));
    std::printf("wrote %s (%s)\n", o->out_dir.c_str(), o->preset.c_str());
  });
}

void add_quantize(CLI::App& app) {
  struct Flags {
    std::string model, type = "q8_0", out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("quantize", "write a Hugging Face folder (GPT-2, Llama, Mistral, Qwen2/3) as a GGUF file llama.cpp loads");
  cmd->add_option("--model", f->model, "Hugging Face model folder")->required();
  cmd->add_option("--type", f->type, "f32, f16, q8_0, q4_0, q4_k_m (Q4_K with Q6_K where llama.cpp puts it), q4_k or q6_k")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0", "q4_k_m", "q4_k", "q6_k"}))
      ->capture_default_str();
  cmd->add_option("--out", f->out, "the GGUF file to write")->required();
  cmd->callback([f] {
    auto r = model::write_gguf_model(f->model, f->type, f->out);
    if (!r.ok()) throw CLI::RuntimeError(fail(r.status().to_string()));
    for (const auto& note : r->notes) std::printf("note: %s\n", note.c_str());
    std::printf("wrote %s: %lld tensors", f->out.c_str(), static_cast<long long>(r->tensors));
    if (r->quantized > 0) {
      std::printf(", %lld of them quantized (", static_cast<long long>(r->quantized));
      const char* sep = "";
      for (const auto& [type, n] : r->types) std::printf("%s%lld %s", sep, static_cast<long long>(n), type.c_str()), sep = ", ";
      std::printf(")");
    }
    std::printf(", %.1f MB\n", static_cast<double>(r->bytes) / 1e6);
  });
}

}  // namespace

void add_model_commands(CLI::App& app) {
  add_run(app);
  add_generate(app);
  add_bench_local(app);
  add_gen_model(app);
  add_quantize(app);
  add_fidelity_command(app);
}

}  // namespace tessera::cli
