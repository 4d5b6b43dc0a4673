#include "kernels/dtype.h"

#include <array>

namespace lmserve::kernels {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  BlockLayout layout;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kF32, "F32", {1, 4}},
    {DType::kF16, "F16", {1, 2}},
    {DType::kBF16, "BF16", {1, 2}},
    {DType::kQ8_0, "Q8_0", {32, 2 + 32}},
    {DType::kQ4_0, "Q4_0", {32, 2 + 16}},
    {DType::kQ4_1, "Q4_1", {32, 2 + 2 + 16}},
    {DType::kQ4_K, "Q4_K", {256, 2 + 2 + 12 + 128}},
    {DType::kQ5_K, "Q5_K", {256, 2 + 2 + 12 + 32 + 128}},
    {DType::kQ6_K, "Q6_K", {256, 128 + 64 + 16 + 2}},
    {DType::kF8E4M3, "F8_E4M3", {1, 1}},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

BlockLayout GetBlockLayout(DType dtype) { return Info(dtype).layout; }

bool IsQuantized(DType dtype) { return Info(dtype).layout.elements_per_block > 1; }

int64_t RowBytes(DType dtype, int64_t num_elements) {
  const BlockLayout layout = Info(dtype).layout;
  return num_elements / layout.elements_per_block * layout.bytes_per_block;
}

}  // namespace lmserve::kernels
