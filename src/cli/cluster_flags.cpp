#include "cli/cluster_flags.h"

#include <map>
#include <string>

namespace tessera::cli {

void add_cluster_flags(CLI::App* cmd, runtime::ClusterOptions& o, int64_t& timeout_s) {
  cmd->add_option("--threads-per-device", o.threads_per_device, "compute threads of each device")->capture_default_str();
  cmd->add_option("--cpus-per-device", o.cpus_per_device, "pin local device d to cores d*N..d*N+N-1 (0: no pinning)")
      ->capture_default_str();
  cmd->add_option("--link", o.link, "emulated links: 500mbit,1ms, with a tc-style burst 100mbit,64kb, or a JSON matrix file");
  cmd->add_option("--cluster", o.cluster_file, "TOML file: terminal endpoint and worker daemons (see README)");
  cmd->add_option("--key", o.key_file, "cluster key file (tessera keygen); default: an ephemeral key");
  cmd->add_flag("--insecure", o.insecure, "no CURVE encryption (benchmarks)");
  cmd->add_option("--memory-limit", o.memory_limit, "memory budget of each device, e.g. 1GB,512MB (checked before loading)");
  cmd->add_option("--device-speed", o.device_speed, "emulated speed of each device in [0.01, 1], e.g. 1,0.5 (kernels idle t(1/s-1))");
  cmd->add_option("--device-order", o.device_order,
                  "the order in which the devices take ranks, the terminal first, e.g. 0,2,1 (a pair decodes on the "
                  "first --decode-devices of them; default: 0,1,..)");
  cmd->add_option("--profile", o.profile_file, "--strategy auto, --bp-plan auto: profile JSON (tessera profile) instead of measuring");
  cmd->add_option("--timeout", timeout_s, "seconds any network wait may take (1..86400)")->capture_default_str();
}

void add_context_flags(CLI::App* cmd, int64_t& ctx_size, core::DType& kv_type) {
  cmd->add_option("--ctx-size", ctx_size,
                  "the context: KV cache positions of a generation, prompt included (default: max_position_embeddings, at most 4096)")
      ->check(CLI::PositiveNumber);
  const std::map<std::string, core::DType> types{{"f32", core::DType::kF32}, {"f16", core::DType::kF16}};
  cmd->add_option("--kv-type", kv_type, "KV cache values: f32, or f16 (half the memory)")
      ->transform(CLI::CheckedTransformer(types, CLI::ignore_case))
      ->default_str("f32");
}

void add_quantize_flag(CLI::App* cmd, kernels::WeightType& type) {
  const std::map<std::string, kernels::WeightType> types{
      {"f32", kernels::WeightType::kF32}, {"q8_0", kernels::WeightType::kQ8_0}, {"q4_0", kernels::WeightType::kQ4_0}};
  cmd->add_option("--quantize", type,
                  "hold the layers' matrices and the LM head quantized, from an F32/F16 folder at load: q8_0 (lossy, "
                  "~3.8x fewer bytes) or q4_0 (lossier, ~7x); f32 keeps them")
      ->transform(CLI::CheckedTransformer(types, CLI::ignore_case))
      ->default_str("f32");
}

}  // namespace tessera::cli
