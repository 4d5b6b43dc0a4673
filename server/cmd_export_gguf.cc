// lmserve export-gguf --model PATH --type f32|f16|q8_0|q4_0|q4_k|q6_k|q4_k_m --out FILE: writes a
// model as GGUF v3.

#include <cstdio>
#include <memory>
#include <string>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "server/cli.h"

namespace lmserve::server {
namespace {

struct ExportGgufOptions {
  std::string model_path;
  engine::GgufOutputType type = engine::GgufOutputType::kF16;
  std::string out;
};

int Run(const ExportGgufOptions& options) {
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      engine::OpenCheckpoint(options.model_path);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "lmserve export-gguf: %s\n",
                 std::string(checkpoint.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = engine::WriteGgufCheckpoint(**checkpoint, options.type, options.out);
      !s.ok()) {
    std::fprintf(stderr, "lmserve export-gguf: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CommandRunner DeclareExportGguf(CLI::App* command) {
  command->footer("Writes a model as a GGUF v3 file, as llama.cpp's convert_hf_to_gguf.py would.");
  auto options = std::make_shared<ExportGgufOptions>();
  AddStringFlag(command, "--model", &options->model_path,
                "a Hugging Face model directory or a .gguf file")
      ->required();
  AddChoiceFlag<engine::GgufOutputType>(
      command, "--type", &options->type, engine::GgufOutputTypeFromName,
      "f32, f16, q8_0, q4_0, q4_k, q6_k, q4_k_m", "f16",
      "tensor type of the matrices: f32, f16, q8_0, q4_0, q4_k, q6_k or q4_k_m (q4_k with the v "
      "and down projections in q6_k); 1-D tensors stay f32; the k-quants fall back to q8_0 for "
      "rows that are not a multiple of 256");
  AddStringFlag(command, "--out", &options->out, "the .gguf file to write")->required();
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
