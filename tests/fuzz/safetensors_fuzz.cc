// libFuzzer: arbitrary bytes as a safetensors file. Parses and reads every tensor as fp32.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "engine/model/mapped_file.h"
#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto mapped = lmserve::engine::MappedFile::FromBytes(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size),
      "fuzz.safetensors");
  auto file = lmserve::engine::SafetensorsFile::Parse(std::move(mapped));
  if (!file.ok()) return 0;
  for (const auto& [name, view] : (*file)->tensors()) (void)(*file)->ReadF32(name);
  return 0;
}
