#include "server/model_session.h"

#include <algorithm>
#include <string>

#include "common/status.h"
#include "common/strings.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/cuda_runner.h"

namespace lmserve::server {

void BindModelSessionFlags(CLI::App* command, ModelSessionOptions* options) {
  AddStringFlag(command, "--model", &options->model_path,
                "a Hugging Face model directory or a .gguf file")
      ->required();
  AddIdListFlag(command, "--ids", &options->ids, "the prompt's token ids, comma-separated: 1,2,3")
      ->required();
  AddIntFlag(command, "--kv-cache-mb", &options->kv_cache_mb,
             "KV cache size in MiB (default: just what the run needs)", 1, int64_t{1} << 30);
  AddThreadsFlag(command, &options->threads);
  AddBackendFlag(command, &options->backend,
                 "cpu (the checkpoint's types by default, fp32 with --dtype float32), cuda (bf16 on "
                 "the GPU by default) or auto (cuda when this build supports the GPU)");
  AddDtypeFlag(command, &options->dtype,
               "weights, activations and KV cache: auto (native on the CPU, bfloat16 on cuda), "
               "native (cpu only: the checkpoint's types), bfloat16 (cuda only) or float32");
}

absl::StatusOr<ModelSession> OpenModelSession(const ModelSessionOptions& options) {
  ModelSession session;
  if (options.ids.empty()) return absl::InvalidArgumentError("--ids: no token ids given");
  session.ids = options.ids;
  LMSERVE_ASSIGN_OR_RETURN(session.checkpoint, engine::OpenCheckpoint(options.model_path));
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

absl::Status CreateRunner(const ModelSessionOptions& options, int64_t context_tokens,
                          ModelSession* session) {
  LMSERVE_RETURN_IF_ERROR(CheckBackendAndDtype(options.backend, options.dtype));
  const engine::ModelConfig& config = session->checkpoint->config();
  engine::RunnerConfig runner_config;
  runner_config.num_threads = options.threads;
  runner_config.dtype = options.dtype;
  runner_config.backend = ResolveBackend(options.backend);
  const bool cuda = runner_config.backend == engine::Backend::kCuda;
  auto block_bytes = [&](int64_t block_size) {
    return cuda ? engine::CudaKvBlockBytes(config, static_cast<int32_t>(block_size), options.dtype)
                : engine::CpuKvBlockBytes(config, static_cast<int32_t>(block_size));
  };
  if (cuda) {
    runner_config.max_num_seqs = 8;
    runner_config.max_num_batched_tokens =
        static_cast<int32_t>(std::max<int64_t>(context_tokens, 256));
  }
  const int64_t block_size = runner_config.block_size_tokens;
  // A table of the whole context in every KV cache group (FirstBlockTables).
  const int64_t blocks_needed = (context_tokens + block_size - 1) / block_size *
                                engine::KvCacheGroupsFor(config).num_groups();
  runner_config.kv_cache_bytes = options.kv_cache_mb.has_value()
                                     ? *options.kv_cache_mb << 20
                                     // at least a byte: a model without KV cache layers
                                     : std::max<int64_t>(blocks_needed * block_bytes(block_size), 1);
  LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelRunner> runner,
                           engine::ModelRunner::Create(*session->checkpoint, runner_config));
  if (runner->num_kv_blocks() < blocks_needed) {
    return absl::InvalidArgumentError(
        StrCat("--kv-cache-mb: a KV cache of ", options.kv_cache_mb.value_or(0), " MiB holds ",
               int64_t{runner->num_kv_blocks()} * block_size, " tokens; this run needs ",
               context_tokens, " (", block_bytes(block_size) * blocks_needed, " bytes)"));
  }
  session->runner = std::move(runner);
  return absl::OkStatus();
}

std::vector<std::vector<int32_t>> FirstBlockTables(const engine::ModelRunner& runner,
                                                   int64_t tokens) {
  const int64_t block_size = runner.block_size_tokens();
  const size_t num_blocks = static_cast<size_t>((tokens + block_size - 1) / block_size);
  std::vector<std::vector<int32_t>> tables(runner.kv_group_windows().size());
  int32_t next = 0;
  for (std::vector<int32_t>& table : tables) {
    for (size_t i = 0; i < num_blocks; ++i) table.push_back(next++);
  }
  return tables;
}

std::vector<std::span<const int32_t>> TableSpans(const std::vector<std::vector<int32_t>>& tables) {
  return {tables.begin(), tables.end()};
}

}  // namespace lmserve::server
