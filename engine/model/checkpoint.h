// A model checkpoint on disk: its configuration and its named weight tensors.
//
// One interface for every file format. Tensor names are Hugging Face's ("model.layers.0.self_attn.
// q_proj.weight"), whatever the file calls them; shapes are row-major, outermost dimension first
// ([out_features, in_features] for a linear layer), as PyTorch writes them. Tensor data points into
// memory-mapped files owned by the Checkpoint: views are valid for the Checkpoint's lifetime.

#ifndef LMSERVE_ENGINE_MODEL_CHECKPOINT_H_
#define LMSERVE_ENGINE_MODEL_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "kernels/dtype.h"

namespace lmserve::engine {

class GgufFile;

struct TensorView {
  std::string name;             // Hugging Face name
  std::string file;             // the file it lives in, for error messages
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;   // outermost first
  const std::byte* data = nullptr;  // host memory, mapped read-only
  int64_t num_bytes = 0;

  int64_t NumElements() const;
  std::string ShapeString() const;  // "[576, 49152]"
};

enum class CheckpointFormat { kSafetensors, kGguf };

class Checkpoint {
 public:
  virtual ~Checkpoint() = default;

  virtual CheckpointFormat format() const = 0;
  // The directory or file the checkpoint was opened from.
  virtual const std::string& path() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Every tensor, by Hugging Face name.
  virtual const std::map<std::string, TensorView, std::less<>>& tensors() const = 0;
  // The GGUF file (metadata for the tokenizer and chat template); nullptr for other formats.
  virtual const GgufFile* gguf() const { return nullptr; }
  // Drops the mapped pages of `tensor` (one of tensors()) from the process's memory, once a
  // runner has copied it out (MappedFile::DropPages): a later read maps them again.
  virtual void DropPages(const TensorView& tensor) const = 0;

  // Returns the tensor, or NotFound naming the checkpoint and the tensor.
  absl::StatusOr<const TensorView*> Find(std::string_view name) const;
  // As Find, and checks the shape: InvalidArgument naming file, tensor, expected and actual shapes.
  absl::StatusOr<const TensorView*> Get(std::string_view name,
                                        const std::vector<int64_t>& expected_shape) const;
};

// Opens a Hugging Face model directory (config.json + safetensors) or a GGUF file.
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string& path);

// The configuration alone, for the dummy load format (RunnerConfig::load_format): a Hugging Face
// directory or its config.json, whose safetensors need not exist (no tensors are listed), or a
// GGUF file (opened as OpenCheckpoint does).
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenConfigOnlyCheckpoint(const std::string& path);

// Format-specific openers (OpenCheckpoint dispatches on the path).
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenHfCheckpoint(const std::string& directory);
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenGgufCheckpoint(const std::string& file);

// Checks that every tensor the model's family declares (family.h) is present with the right shape
// and a byte count its type takes. Errors name the file and the tensor.
absl::Status ValidateCheckpointTensors(const Checkpoint& checkpoint);

// OK if the tensor's byte count is what its element count takes in its type (whole blocks for the
// GGUF block formats); else InvalidArgument naming the file and the tensor.
absl::Status CheckTensorBytes(const TensorView& tensor);

// Hugging Face tensor names of layer `layer`.
std::string LayerTensorName(int64_t layer, std::string_view suffix);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_CHECKPOINT_H_
