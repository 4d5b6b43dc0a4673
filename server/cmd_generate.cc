// lmserve generate --model PATH --ids 1,2,3 --max-tokens N: greedy decoding on the CPU runner, one
// token per step through the paged KV cache. Prints {"ids": [...]}, the generated ids only, on
// stdout; stops after an EOS id of the model's config (which is printed) unless --ignore-eos.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/strings.h"
#include "kernels/cpu/argmax.h"
#include "server/cli.h"
#include "server/model_session.h"

namespace lmserve::server {
namespace {

struct GenerateOptions {
  ModelSessionOptions model;
  int64_t max_tokens = 16;
  bool ignore_eos = false;
};

int Run(const GenerateOptions& options) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lmserve generate: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  absl::StatusOr<ModelSession> session = OpenModelSession(options.model);
  if (!session.ok()) return fail(session.status());
  const engine::ModelConfig& config = session->checkpoint->config();
  const int64_t num_ids = static_cast<int64_t>(session->ids.size());
  if (num_ids >= config.max_position_embeddings) {
    return fail(absl::InvalidArgumentError(StrCat("--ids: ", num_ids,
                                                  " ids leave no room in the model's context of ",
                                                  config.max_position_embeddings, " tokens")));
  }
  // The last generated token is never fed back, so the context holds num_ids + max_tokens - 1.
  int64_t steps = options.max_tokens;
  if (num_ids + steps - 1 > config.max_position_embeddings) {
    steps = config.max_position_embeddings - num_ids + 1;
    std::fprintf(
        stderr, "lmserve generate: the model's context of %lld tokens allows %lld tokens\n",
        static_cast<long long>(config.max_position_embeddings), static_cast<long long>(steps));
  }
  if (absl::Status s =
          CreateRunner(options.model, num_ids + std::max<int64_t>(steps - 1, 0), &*session);
      !s.ok()) {
    return fail(s);
  }

  const bool ignore_eos = options.ignore_eos;
  const int64_t vocab = config.vocab_size;
  const std::vector<std::vector<int32_t>> tables =
      FirstBlockTables(*session->runner, num_ids + std::max<int64_t>(steps - 1, 0));
  std::vector<int32_t> generated;
  engine::StepBatch batch;
  engine::StepOutput output;
  std::vector<int32_t> next = session->ids;  // the tokens the next step computes
  int32_t num_computed = 0;
  for (int64_t step = 0; step < steps; ++step) {
    batch.Clear();
    batch.AddSequence(next, num_computed, TableSpans(tables), engine::LogitsMode::kLast);
    if (absl::Status s = session->runner->Execute(batch, &output); !s.ok()) return fail(s);
    int32_t token = 0;
    kernels::Argmax(
        {.input = output.logits.data(), .output = &token, .num_rows = 1, .row_size = vocab});
    generated.push_back(token);
    if (!ignore_eos && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                           config.eos_token_ids.end()) {
      break;
    }
    num_computed += static_cast<int32_t>(next.size());
    next.assign(1, token);
  }
  std::printf("{\"ids\": [%s]}\n", StrJoin(generated, ", ").c_str());
  return 0;
}

}  // namespace

CommandRunner DeclareGenerate(CLI::App* command) {
  command->footer(
      "Greedy decoding after --ids. Prints {\"ids\": [...]}, the generated ids only; stops after "
      "an EOS id of the model (included) unless --ignore-eos.");
  auto options = std::make_shared<GenerateOptions>();
  BindModelSessionFlags(command, &options->model);
  AddIntFlag(command, "--max-tokens", &options->max_tokens, "the most tokens to generate", 0);
  AddBoolFlag(command, "--ignore-eos", &options->ignore_eos, "keep generating past EOS ids");
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
