// The model set-up shared by `lmserve logits` and `lmserve generate`: the flags they share, and a
// checkpoint with a runner whose KV cache fits the token ids they will run.

#ifndef LMSERVE_SERVER_MODEL_SESSION_H_
#define LMSERVE_SERVER_MODEL_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "server/command_line.h"

namespace lmserve::server {

// What --model, --ids, --kv-cache-mb, --threads, --backend and --dtype say.
struct ModelSessionOptions {
  std::string model_path;
  std::vector<int32_t> ids;                     // the prompt
  std::optional<int64_t> kv_cache_mb;           // nullopt: just what the run needs
  int32_t threads = 0;                          // 0: one per core
  BackendFlag backend = engine::Backend::kCpu;  // the fp32 reference unless told otherwise
  engine::RunnerDType dtype = engine::RunnerDType::kAuto;
};

// Declares --model, --ids, --kv-cache-mb, --threads, --backend and --dtype, bound to `*options`.
void BindModelSessionFlags(CLI::App* command, ModelSessionOptions* options);

struct ModelSession {
  std::unique_ptr<engine::Checkpoint> checkpoint;
  std::unique_ptr<engine::ModelRunner> runner;
  std::vector<int32_t> ids;  // --ids, checked against the vocabulary
};

// Opens --model and checks --ids (non-empty, each in the model's vocabulary). Errors name the
// flag or the file at fault.
absl::StatusOr<ModelSession> OpenModelSession(const ModelSessionOptions& options);

// Builds session->runner, a runner (--backend, --dtype) whose KV cache holds `context_tokens`
// tokens: a cache of --kv-cache-mb when given (an error when that is too small), otherwise exactly
// what is needed. --threads sets the CPU threads. Errors name the flag at fault.
absl::Status CreateRunner(const ModelSessionOptions& options, int64_t context_tokens,
                          ModelSession* session);

// One block table per KV cache group of `runner` covering `tokens` tokens: blocks 0 .. n-1 in the
// first group, n .. 2n-1 in the second, and so on (the groups share the pool).
std::vector<std::vector<int32_t>> FirstBlockTables(const engine::ModelRunner& runner,
                                                   int64_t tokens);
// The tables as StepBatch::AddSequence takes them.
std::vector<std::span<const int32_t>> TableSpans(const std::vector<std::vector<int32_t>>& tables);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_MODEL_SESSION_H_
