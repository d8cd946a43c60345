#include "runtime/daemon.h"

#include <filesystem>
#include <variant>

#include "comm/control.h"
#include "core/logging.h"
#include "model/config.h"
#include "runtime/cluster_file.h"
#include "runtime/cluster_profile.h"
#include "runtime/protocol.h"
#include "runtime/worker.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using nlohmann::json;

Result<std::string> resolve_model(const std::string& name, const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  if (roots.empty()) return core::invalid_argument("this worker serves no models (start it with --models DIR)");
  const fs::path rel(name);
  if (name.empty() || rel.is_absolute() || rel.has_root_name())
    return core::invalid_argument("model '" + name + "': a job names a model relative to the worker's model roots");
  for (const auto& part : rel)
    if (part == "..") return core::invalid_argument("model '" + name + "' leaves the worker's model roots");
  for (const std::string& root : roots) {
    std::error_code ec;
    const fs::path base = fs::canonical(root, ec);
    if (ec) continue;
    const fs::path dir = fs::weakly_canonical(base / rel, ec);  // symlinks resolved
    if (ec) continue;
    const std::string b = base.string() + "/", d = dir.string() + "/";
    if (d.compare(0, b.size(), b) != 0) continue;  // a link out of the root
    if (fs::is_directory(dir, ec) && fs::is_regular_file(dir / "config.json", ec)) return dir.string();
  }
  return core::not_found("model '" + name + "' is not under any of this worker's model roots");
}

Status check_daemon_job(const JobSpec& job, const std::vector<std::string>& roots) {
  if (job.rank == 0) return core::invalid_argument("rank 0 is the terminal");
  TESSERA_ASSIGN_OR_RETURN(const std::string dir, resolve_model(job.model_dir, roots));
  TESSERA_ASSIGN_OR_RETURN(const model::ModelConfig cfg, model::load_config(dir));
  TESSERA_RETURN_IF_ERROR(job.completed_plan(cfg).status());
  return job_links(job.link, static_cast<int>(job.endpoints.size())).status();
}

namespace {

// One job, start to end; its outcome is logged (the daemon carries on either way).
void run_daemon_job(const JobSpec& job, WorkerEnv env) {
  comm::CommStats cs;
  env.stats = &cs;
  const Status st = run_worker(job, env);
  const std::string buffered = "unmatched bytes peak " + std::to_string(cs.unmatched_bytes_peak) + ", " +
                               std::to_string(cs.unmatched_frames_dropped) + " frames (" +
                               std::to_string(cs.unmatched_bytes_dropped) + " bytes) dropped over the cap";
  if (st.ok()) {
    spdlog::info("job of group {} finished ({})", job.group_id, buffered);
  } else {
    spdlog::warn("job of group {} ended: {} ({})", job.group_id, core::for_log(st.to_string()), buffered);
  }
}

}  // namespace

Status run_worker_daemon(const DaemonOptions& opts) {
  std::optional<comm::ClusterKey> key;
  if (!opts.insecure) {
    if (opts.key_file.empty()) return core::invalid_argument("a worker needs --key FILE (tessera keygen) or --insecure");
    TESSERA_ASSIGN_OR_RETURN(key, comm::read_key_file(opts.key_file));
  }
  // The data port listens on the interface --listen names (127.0.0.1 stays
  // on loopback); only a wildcard --listen binds every interface.
  TESSERA_ASSIGN_OR_RETURN(std::string data_bind, next_port_endpoint(opts.listen));
  TESSERA_ASSIGN_OR_RETURN(auto server, comm::ControlServer::bind(opts.listen, key));
  spdlog::info("worker listening for jobs on {} (data on {})", opts.listen, data_bind);
  // Nothing a peer sends ends this loop: bad requests are answered or
  // dropped, and a socket left in a bad state is reset. Only local failures
  // (the endpoint cannot be bound again) return.
  auto answer = [&](const json& j) -> Status {
    const Status st = server->reply(j.dump());
    if (st.ok()) return st;
    spdlog::warn("control: reply failed ({}); resetting the control socket", st.to_string());
    return server->reset();
  };
  // One dispatch: each kind of request has its handler; a request that does
  // not parse, or a job the daemon cannot run, is refused with the reason.
  int done = 0;
  uint64_t refused = 0;  // jobs and requests refused, for the log
  const auto handle = Overloaded{
      // A ping: the terminal checks that the daemon is up and holds its key.
      [&](const PingRequest&) { return answer(ok_answer()); },
      // A profile request: answer with this device's profile, or join the
      // terminal's link measurement (runtime/cluster_profile.h).
      [&](const ProfileJob& pj) -> Status {
        if (pj.part == ProfileJob::Part::kDevice) return answer(daemon_device_profile(pj, opts.model_roots, key.has_value()));
        TESSERA_RETURN_IF_ERROR(answer(ok_answer()));
        Status st = core::ok_status();
        try {  // a backstop: nothing a peer sends may end the daemon
          st = daemon_link_profile(pj, WorkerEnv{data_bind, key, nullptr, &opts.model_roots, comm::Millis(60000)});
        } catch (const std::exception& e) {
          st = core::internal_error(std::string("link profile failed: ") + e.what());
        }
        if (st.ok()) spdlog::info("link profile of group {} done", pj.group_id);
        else spdlog::warn("link profile of group {} ended: {}", pj.group_id, core::for_log(st.to_string()));
        return core::ok_status();
      },
      [&](const JobSpec& request) -> Status {
        if (const Status checked = check_daemon_job(request, opts.model_roots); !checked.ok()) {
          // Quoted short and escaped, and logged at the 1st, 2nd, 4th, ... refusal:
          // the job's fields are the requester's bytes.
          const std::string why = core::for_log(checked.to_string());
          if (++refused; (refused & (refused - 1)) == 0) spdlog::warn("control: refused a job ({} so far): {}", refused, why);
          return answer(refusal(why));
        }
        JobSpec job = request;
        job.insecure = opts.insecure;  // the daemon's own security setting, not the request's
        TESSERA_RETURN_IF_ERROR(answer(ok_answer()));
        ++done;
        try {  // a backstop: nothing a peer sends may end the daemon
          run_daemon_job(job, WorkerEnv{data_bind, key, nullptr, &opts.model_roots, comm::Millis(60000)});
        } catch (const std::exception& e) {
          spdlog::error("job of group {} failed: {}", core::for_log(job.group_id), core::for_log(e.what()));
        }
        return core::ok_status();
      }};
  while (opts.jobs == 0 || done < opts.jobs) {
    auto request = server->receive(std::chrono::hours(1));
    if (!request.ok()) {
      if (request.status().code() == core::ErrorCode::kTimeout) continue;
      spdlog::warn("control: {}; resetting the control socket", request.status().to_string());
      TESSERA_RETURN_IF_ERROR(server->reset());
      continue;
    }
    auto parsed = parse_control_request(*request);
    if (!parsed.ok()) {
      const std::string why = core::for_log(parsed.status().to_string());
      if (++refused; (refused & (refused - 1)) == 0) spdlog::warn("control: refused a request ({} so far): {}", refused, why);
      TESSERA_RETURN_IF_ERROR(answer(refusal(why)));
      continue;
    }
    TESSERA_RETURN_IF_ERROR(std::visit(handle, *parsed));
  }
  return core::ok_status();
}

}  // namespace tessera::runtime
