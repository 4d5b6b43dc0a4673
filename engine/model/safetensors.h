// The safetensors format: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the data. Read through a memory mapping, written for `lmserve
// logits` and tests.

#ifndef LMSERVE_ENGINE_MODEL_SAFETENSORS_H_
#define LMSERVE_ENGINE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/mapped_file.h"

namespace lmserve::engine {

class SafetensorsFile {
 public:
  // Maps and parses `path`. Every error names the file (and the tensor, where one is at fault):
  // a truncated file, a corrupt header, an unsupported dtype, a byte range that disagrees with the
  // shape or leaves the file.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses bytes already in memory (fuzzing, tests).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(std::unique_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  const MappedFile& file() const { return *file_; }
  // Tensors by their names in the file; views point into the mapping.
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

  // Copies tensor `name` out as fp32 (F32, F16 and BF16). NotFound names the file and tensor.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name) const;

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}

  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

struct TensorToWrite {
  std::string name;
  kernels::DType dtype;  // F32, F16 or BF16
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes a safetensors file (tensors in the given order, 8-byte aligned). Errors name the file.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_SAFETENSORS_H_
