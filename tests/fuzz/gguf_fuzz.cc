// libFuzzer: arbitrary bytes as a GGUF file. Parses, reads every metadata value through the typed
// getters, dequantizes every tensor, and builds a checkpoint from the file. Any crash, sanitizer
// report or leak is a bug; errors are the expected outcome for almost every input.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf.h"
#include "engine/model/mapped_file.h"
#include "kernels/cpu/dequant.h"

namespace {

using lmserve::engine::GgufFile;

void TouchMetadata(const GgufFile& file) {
  for (const auto& [key, value] : file.metadata()) {
    (void)value.ToString(4);
    (void)file.GetString(key);
    (void)file.GetInt(key);
    (void)file.GetFloat(key);
    (void)file.GetBool(key);
    (void)file.GetStringArray(key);
    (void)file.GetIntArray(key);
    (void)file.GetFloatArray(key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto mapped = lmserve::engine::MappedFile::FromBytes(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf");
  auto file = GgufFile::Parse(std::move(mapped));
  if (!file.ok()) return 0;
  TouchMetadata(**file);
  std::vector<float> values;
  for (const lmserve::engine::GgufTensorInfo& tensor : (*file)->tensors()) {
    // The parser bounds every tensor by the file: at most 2 elements per byte for these types.
    values.resize(static_cast<size_t>(tensor.NumElements()));
    lmserve::kernels::DequantizeToF32(tensor.dtype, tensor.data, values.data(),
                                      tensor.NumElements());
  }
  auto checkpoint = lmserve::engine::GgufCheckpointFromFile(*std::move(file));
  if (!checkpoint.ok()) return 0;
  (void)lmserve::engine::RopeInverseFrequencies((*checkpoint)->config().rope, (*checkpoint)->config().head_dim);
  for (const auto& [name, view] : (*checkpoint)->tensors()) {
    values.resize(static_cast<size_t>(view.NumElements()));
    lmserve::kernels::DequantizeToF32(view.dtype, view.data, values.data(), view.NumElements());
  }
  return 0;
}
