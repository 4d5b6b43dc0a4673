#include "server/model_session.h"

#include "common/strings.h"
#include <algorithm>
#include <optional>
#include <string>

#include "engine/runner/cpu_runner.h"
#include "engine/runner/cuda_runner.h"

namespace lmserve::server {

void AddModelOptions(Args* args) {
  args->Required("model", "a Hugging Face model directory or a .gguf file")
      .Required("ids", "the prompt's token ids, comma-separated: 1,2,3")
      .Option("kv-cache-mb", "KV cache size in MiB (default: just what the run needs)")
      .Option("threads", "CPU threads for matrix products and attention; 0: one per core", "0")
      .Option("backend", "cpu (the fp32 reference) or cuda (bf16 on the GPU by default)", "cpu")
      .Option("dtype",
              "weights, activations and KV cache: auto (float32 on the CPU, bfloat16 on cuda), "
              "bfloat16 (cuda only) or float32",
              "auto");
}

absl::StatusOr<ModelSession> OpenModelSession(const Args& args) {
  ModelSession session;
  absl::StatusOr<std::vector<int32_t>> ids = args.GetIntList("ids");
  if (!ids.ok()) return ids.status();
  if (ids->empty()) return absl::InvalidArgumentError("--ids: no token ids given");
  session.ids = *std::move(ids);
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      engine::OpenCheckpoint(args.Get("model"));
  if (!checkpoint.ok()) return checkpoint.status();
  session.checkpoint = *std::move(checkpoint);
  const int64_t vocab = session.checkpoint->config().vocab_size;
  for (size_t i = 0; i < session.ids.size(); ++i) {
    if (session.ids[i] < 0 || session.ids[i] >= vocab) {
      return absl::InvalidArgumentError(StrCat("--ids: token id ", session.ids[i], " (position ", i,
                                               ") is outside the model's vocabulary [0, ", vocab,
                                               ")"));
    }
  }
  return session;
}

absl::Status CreateRunner(const Args& args, int64_t context_tokens, ModelSession* session) {
  const engine::ModelConfig& config = session->checkpoint->config();
  engine::RunnerConfig runner_config;
  absl::StatusOr<int64_t> threads = args.GetInt("threads");
  if (!threads.ok()) return threads.status();
  if (*threads < 0 || *threads > 1024) {
    return absl::InvalidArgumentError(StrCat("--threads: ", *threads, " is not in [0, 1024]"));
  }
  runner_config.num_threads = static_cast<int32_t>(*threads);
  const std::string backend = args.Get("backend");
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(StrCat("--backend: '", backend, "' is not one of cpu, cuda"));
  }
  const std::optional<engine::RunnerDType> dtype = engine::RunnerDTypeFromName(args.Get("dtype"));
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(
        StrCat("--dtype: '", args.Get("dtype"), "' is not one of auto, bfloat16, float32"));
  }
  runner_config.dtype = *dtype;
  const bool cuda = backend == "cuda";
  auto block_bytes = [&](int64_t block_size) {
    return cuda ? engine::CudaKvBlockBytes(config, static_cast<int32_t>(block_size), *dtype)
                : engine::CpuKvBlockBytes(config, static_cast<int32_t>(block_size));
  };
  if (cuda) {
    runner_config.backend = engine::Backend::kCuda;
    runner_config.max_num_seqs = 8;
    runner_config.max_num_batched_tokens =
        static_cast<int32_t>(std::max<int64_t>(context_tokens, 256));
  }
  const int64_t block_size = runner_config.block_size_tokens;
  const int64_t blocks_needed = (context_tokens + block_size - 1) / block_size;
  if (args.Has("kv-cache-mb")) {
    absl::StatusOr<int64_t> megabytes = args.GetInt("kv-cache-mb");
    if (!megabytes.ok()) return megabytes.status();
    if (*megabytes <= 0 || *megabytes > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(StrCat("--kv-cache-mb: ", *megabytes, " is not positive"));
    }
    runner_config.kv_cache_bytes = *megabytes << 20;
  } else {
    runner_config.kv_cache_bytes = blocks_needed * block_bytes(block_size);
  }
  absl::StatusOr<std::unique_ptr<engine::ModelRunner>> runner =
      engine::ModelRunner::Create(*session->checkpoint, runner_config);
  if (!runner.ok()) return runner.status();
  if ((*runner)->num_kv_blocks() < blocks_needed) {
    return absl::InvalidArgumentError(
        StrCat("--kv-cache-mb: a KV cache of ", args.Get("kv-cache-mb"), " MiB holds ",
               int64_t{(*runner)->num_kv_blocks()} * block_size, " tokens; this run needs ",
               context_tokens, " (",
               block_bytes(block_size) * blocks_needed,
               " bytes)"));
  }
  session->runner = *std::move(runner);
  return absl::OkStatus();
}

std::vector<int32_t> FirstBlocks(const engine::ModelRunner& runner, int64_t tokens) {
  const int64_t block_size = runner.block_size_tokens();
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + block_size - 1) / block_size));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  return blocks;
}

}  // namespace lmserve::server
