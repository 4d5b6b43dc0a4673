// lmserve logits --model PATH --ids 1,2,3 --out FILE.safetensors: the teacher-forced logits of the
// ids at every position, one step on the CPU runner, written as tensor `logits`, F32,
// [number of ids, vocab_size].

#include <cstdio>
#include <memory>
#include <string>

#include "engine/model/safetensors.h"
#include "server/cli.h"
#include "server/model_session.h"

namespace lmserve::server {
namespace {

struct LogitsOptions {
  ModelSessionOptions model;
  std::string out;
};

int Run(const LogitsOptions& options) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lmserve logits: %s\n", std::string(status.message()).c_str());
    return 1;
  };

  absl::StatusOr<ModelSession> session = OpenModelSession(options.model);
  if (!session.ok()) return fail(session.status());
  const int64_t num_ids = static_cast<int64_t>(session->ids.size());
  const int64_t context = session->checkpoint->config().max_position_embeddings;
  if (num_ids > context) {
    return fail(absl::InvalidArgumentError("--ids: " + std::to_string(num_ids) +
                                           " ids exceed the model's context of " +
                                           std::to_string(context) + " tokens"));
  }
  if (absl::Status s = CreateRunner(options.model, num_ids, &*session); !s.ok()) return fail(s);

  engine::StepBatch batch;
  const std::vector<std::vector<int32_t>> tables = FirstBlockTables(*session->runner, num_ids);
  batch.AddSequence(session->ids, 0, TableSpans(tables), engine::LogitsMode::kAll);
  engine::StepOutput output;
  if (absl::Status s = session->runner->Execute(batch, &output); !s.ok()) return fail(s);

  const int64_t vocab = session->runner->model_config().vocab_size;
  const engine::TensorToWrite logits{
      .name = "logits",
      .dtype = kernels::DType::kF32,
      .shape = {num_ids, vocab},
      .data = std::as_bytes(std::span<const float>(output.logits)),
  };
  if (absl::Status s = engine::WriteSafetensors(options.out, {logits}); !s.ok()) return fail(s);
  std::fprintf(stderr, "lmserve logits: wrote logits [%lld, %lld] to %s\n",
               static_cast<long long>(num_ids), static_cast<long long>(vocab), options.out.c_str());
  return 0;
}

}  // namespace

CommandRunner DeclareLogits(CLI::App* command) {
  command->footer(
      "Computes the teacher-forced logits of --ids at every position (one runner step) and "
      "writes them to --out as a safetensors file: tensor `logits`, F32, [number of ids, vocab].");
  auto options = std::make_shared<LogitsOptions>();
  BindModelSessionFlags(command, &options->model);
  AddStringFlag(command, "--out", &options->out, "the safetensors file to write")->required();
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
