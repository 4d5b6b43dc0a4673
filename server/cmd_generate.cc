// lmserve generate --model PATH --ids 1,2,3 --max-tokens N: greedy decoding on the CPU runner, one
// token per step through the paged KV cache. Prints {"ids": [...]}, the generated ids only, on
// stdout; stops after an EOS id of the model's config (which is printed) unless --ignore-eos.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common/strings.h"
#include "kernels/cpu/argmax.h"
#include "server/args.h"
#include "server/cli.h"
#include "server/model_session.h"

namespace lmserve::server {

int RunGenerate(int argc, char** argv) {
  Args args("generate",
            "Greedy decoding after --ids on the CPU runner. Prints {\"ids\": [...]}, the generated "
            "ids only; stops after an EOS id of the model (included) unless --ignore-eos.");
  AddModelOptions(&args);
  args.Option("max-tokens", "the most tokens to generate", "16")
      .Flag("ignore-eos", "keep generating past EOS ids");
  absl::StatusOr<bool> parsed = args.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (!*parsed) return 0;
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lmserve generate: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  absl::StatusOr<int64_t> max_tokens = args.GetInt("max-tokens");
  if (!max_tokens.ok() || *max_tokens < 0) {
    std::fprintf(stderr, "lmserve generate: --max-tokens: want a non-negative integer, got '%s'\n",
                 args.Get("max-tokens").c_str());
    return 2;
  }

  absl::StatusOr<ModelSession> session = OpenModelSession(args);
  if (!session.ok()) return fail(session.status());
  const engine::ModelConfig& config = session->checkpoint->config();
  const int64_t num_ids = static_cast<int64_t>(session->ids.size());
  if (num_ids >= config.max_position_embeddings) {
    return fail(absl::InvalidArgumentError(StrCat("--ids: ", num_ids,
                                                  " ids leave no room in the model's context of ",
                                                  config.max_position_embeddings, " tokens")));
  }
  // The last generated token is never fed back, so the context holds num_ids + max_tokens - 1.
  int64_t steps = *max_tokens;
  if (num_ids + steps - 1 > config.max_position_embeddings) {
    steps = config.max_position_embeddings - num_ids + 1;
    std::fprintf(
        stderr, "lmserve generate: the model's context of %lld tokens allows %lld tokens\n",
        static_cast<long long>(config.max_position_embeddings), static_cast<long long>(steps));
  }
  if (absl::Status s = CreateRunner(args, num_ids + std::max<int64_t>(steps - 1, 0), &*session);
      !s.ok()) {
    return fail(s);
  }

  const bool ignore_eos = args.GetFlag("ignore-eos");
  const int64_t vocab = config.vocab_size;
  const std::vector<int32_t> blocks =
      FirstBlocks(*session->runner, num_ids + std::max<int64_t>(steps - 1, 0));
  std::vector<int32_t> generated;
  engine::StepBatch batch;
  engine::StepOutput output;
  std::vector<int32_t> next = session->ids;  // the tokens the next step computes
  int32_t num_computed = 0;
  for (int64_t step = 0; step < steps; ++step) {
    batch.Clear();
    batch.AddSequence(next, num_computed, blocks, engine::LogitsMode::kLast);
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

}  // namespace lmserve::server
