#include "engine/model/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/family.h"
#include "absl/strings/match.h"

namespace lmserve::engine {

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const { return StrCat("[", StrJoin(shape, ", "), "]"); }

std::string LayerTensorName(int64_t layer, std::string_view suffix) {
  return StrCat("model.layers.", layer, ".", std::string(suffix));
}

absl::StatusOr<const TensorView*> Checkpoint::Find(std::string_view name) const {
  auto it = tensors().find(name);
  if (it == tensors().end()) {
    return absl::NotFoundError(StrCat(path(), ": missing tensor '", std::string(name), "'"));
  }
  return &it->second;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(std::string_view name,
                                                  const std::vector<int64_t>& expected_shape) const {
  absl::StatusOr<const TensorView*> tensor = Find(name);
  if (!tensor.ok()) return tensor.status();
  if ((*tensor)->shape != expected_shape) {
    return absl::InvalidArgumentError(StrCat(
        (*tensor)->file, ": tensor '", std::string(name), "' has shape ", (*tensor)->ShapeString(),
        ", expected [", StrJoin(expected_shape, ", "), "]"));
  }
  return tensor;
}

absl::Status CheckTensorBytes(const TensorView& tensor) {
  const kernels::BlockLayout block = kernels::GetBlockLayout(tensor.dtype);
  const int64_t elements = tensor.NumElements();
  if (elements % block.elements_per_block != 0 ||
      tensor.num_bytes != elements / block.elements_per_block * block.bytes_per_block) {
    return absl::InvalidArgumentError(StrCat(tensor.file, ": tensor '", tensor.name, "' holds ",
                                             tensor.num_bytes, " bytes, not what ", elements,
                                             " elements of ", kernels::DTypeName(tensor.dtype),
                                             " take"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpointTensors(const Checkpoint& checkpoint) {
  LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<ModelDescription> model,
                           DescribeModel(checkpoint.config()));
  return model->weights().Validate(checkpoint);
}

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return OpenHfCheckpoint(path);
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(StrCat(path, ": no such file or directory"));
  }
  if (absl::EndsWith(path, ".gguf")) return OpenGgufCheckpoint(path);
  // A GGUF file under another name: recognise it by its magic.
  char magic[4] = {};
  std::ifstream(path, std::ios::binary).read(magic, sizeof(magic));
  if (std::string_view(magic, sizeof(magic)) == "GGUF") return OpenGgufCheckpoint(path);
  return absl::InvalidArgumentError(StrCat(
      path, ": not a model: expected a Hugging Face model directory or a .gguf file"));
}

}  // namespace lmserve::engine
