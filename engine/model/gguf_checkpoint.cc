// Placeholder until the GGUF reader lands (same session): GGUF files are rejected clearly.
#include "common/strings.h"
#include "engine/model/checkpoint.h"

namespace lmserve::engine {

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenGgufCheckpoint(const std::string& file) {
  return absl::UnimplementedError(StrCat(file, ": GGUF loading is not built yet"));
}

}  // namespace lmserve::engine
