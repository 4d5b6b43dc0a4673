// lmserve export-gguf --model PATH --type f32|f16|q8_0 --out FILE: writes a model as GGUF v3.

#include <cstdio>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "server/args.h"
#include "server/cli.h"

namespace lmserve::server {

int RunExportGguf(int argc, char** argv) {
  Args args("export-gguf",
            "Writes a model as a GGUF v3 file, as llama.cpp's convert_hf_to_gguf.py would.");
  args.Required("model", "a Hugging Face model directory or a .gguf file")
      .Option("type", "tensor type of the matrices: f32, f16 or q8_0 (1-D tensors stay f32)", "f16")
      .Required("out", "the .gguf file to write");
  absl::StatusOr<bool> parsed = args.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (!*parsed) return 0;
  const std::optional<engine::GgufOutputType> type =
      engine::GgufOutputTypeFromName(args.Get("type"));
  if (!type.has_value()) {
    std::fprintf(stderr, "lmserve export-gguf: --type must be f32, f16 or q8_0, not '%s'\n",
                 args.Get("type").c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      engine::OpenCheckpoint(args.Get("model"));
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "lmserve export-gguf: %s\n",
                 std::string(checkpoint.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = engine::WriteGgufCheckpoint(**checkpoint, *type, args.Get("out")); !s.ok()) {
    std::fprintf(stderr, "lmserve export-gguf: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace lmserve::server
