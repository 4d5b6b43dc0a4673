// The model set-up shared by `lmserve logits` and `lmserve generate`: the options they share, and a
// checkpoint with a CPU runner whose KV cache fits the token ids they will run.

#ifndef LMSERVE_SERVER_MODEL_SESSION_H_
#define LMSERVE_SERVER_MODEL_SESSION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "server/args.h"

namespace lmserve::server {

// Declares --model, --ids, --kv-cache-mb, --threads, --backend and --dtype.
void AddModelOptions(Args* args);

struct ModelSession {
  std::unique_ptr<engine::Checkpoint> checkpoint;
  std::unique_ptr<engine::ModelRunner> runner;
  std::vector<int32_t> ids;  // --ids, checked against the vocabulary
};

// Opens --model and parses --ids (non-empty, each in the model's vocabulary). Errors name the
// option or the file at fault.
absl::StatusOr<ModelSession> OpenModelSession(const Args& args);

// Builds session->runner, a runner (--backend, --dtype) whose KV cache holds `context_tokens`
// tokens: a cache of --kv-cache-mb when given (an error when that is too small), otherwise exactly
// what is needed. --threads sets the CPU threads. Errors name the option at fault.
absl::Status CreateRunner(const Args& args, int64_t context_tokens, ModelSession* session);

// Blocks 0 .. n-1 covering `tokens` tokens in `runner`'s block size.
std::vector<int32_t> FirstBlocks(const engine::ModelRunner& runner, int64_t tokens);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_MODEL_SESSION_H_
