#include "engine/model/safetensors.h"

#include <cstring>
#include <fstream>
#include <limits>

#include "common/strings.h"
#include "kernels/cpu/half.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

using kernels::DType;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // as the reference implementation limits it

absl::Status Corrupt(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(path, ": corrupt safetensors file: ", what));
}

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    std::unique_ptr<MappedFile> mapped) {
  const std::string path = mapped->path();
  const std::span<const std::byte> bytes = mapped->bytes();
  if (bytes.size() < 8) return Corrupt(path, "shorter than its 8-byte header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);  // little-endian host
  if (header_bytes > kMaxHeaderBytes || header_bytes > bytes.size() - 8) {
    return Corrupt(path, StrCat("header length ", header_bytes, " exceeds the file (",
                                      bytes.size(), " bytes)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  json header = json::parse(header_begin, header_begin + header_bytes, nullptr,
                            /*allow_exceptions=*/false);
  if (!header.is_object()) return Corrupt(path, "header is not a JSON object");
  const std::byte* data_begin = bytes.data() + 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - 8 - header_bytes;

  auto out = std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(mapped)));
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (value.is_string()) out->metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = StrCat("tensor '", name, "'");
    if (!entry.is_object()) return Corrupt(path, StrCat(where, " is not an object"));
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string() || shape_it == entry.end() ||
        !shape_it->is_array() || offsets_it == entry.end() || !offsets_it->is_array() ||
        offsets_it->size() != 2) {
      return Corrupt(path, StrCat(where, " lacks dtype, shape or data_offsets"));
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    std::optional<DType> dtype = DTypeFromSafetensors(dtype_name);
    if (!dtype.has_value()) {
      return absl::UnimplementedError(StrCat(path, ": ", where, " has dtype ", dtype_name,
                                                   "; supported: F32, F16, BF16, F8_E4M3"));
    }
    TensorView view;
    view.name = name;
    view.file = path;
    view.dtype = *dtype;
    uint64_t num_elements = 1;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_unsigned()) return Corrupt(path, StrCat(where, " has a bad shape"));
      const uint64_t d = dim.get<uint64_t>();
      if (d != 0 && num_elements > std::numeric_limits<uint32_t>::max() * uint64_t{64} / d) {
        return Corrupt(path, StrCat(where, " has an absurd shape"));
      }
      num_elements *= d;
      view.shape.push_back(static_cast<int64_t>(d));
    }
    if (!(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return Corrupt(path, StrCat(where, " has bad data_offsets"));
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    const uint64_t element_bytes = kernels::GetBlockLayout(*dtype).bytes_per_block;
    if (begin > end || end > data_bytes) {
      return Corrupt(path, StrCat(where, " byte range [", begin, ", ", end,
                                        ") leaves the data section (", data_bytes,
                                        " bytes): truncated file?"));
    }
    if (end - begin != num_elements * element_bytes) {
      return Corrupt(path, StrCat(where, " holds ", end - begin, " bytes but its shape ",
                                        view.ShapeString(), " of ", dtype_name, " needs ",
                                        num_elements * element_bytes));
    }
    view.data = data_begin + begin;
    view.num_bytes = static_cast<int64_t>(end - begin);
    out->tensors_.emplace(name, std::move(view));
  }
  return out;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(StrCat(path(), ": no tensor '", name, "'"));
  }
  const TensorView& view = it->second;
  std::vector<float> out(view.NumElements());
  for (size_t i = 0; i < out.size(); ++i) {
    switch (view.dtype) {
      case DType::kF32:
        std::memcpy(&out[i], view.data + 4 * i, 4);
        break;
      case DType::kF16:
      case DType::kBF16: {
        uint16_t bits;
        std::memcpy(&bits, view.data + 2 * i, 2);
        out[i] = view.dtype == DType::kF16 ? kernels::F16ToF32(bits) : kernels::Bf16ToF32(bits);
        break;
      }
      default:
        return absl::InternalError("unreachable dtype");
    }
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16 &&
        t.dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(StrCat(path, ": cannot write ", t.name, " as ",
                                                     kernels::DTypeName(t.dtype)));
    }
    header[t.name] = {{"dtype", std::string(kernels::DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(StrCat(path, ": cannot open for writing"));
  const uint64_t header_size = header_text.size();
  out.write(reinterpret_cast<const char*>(&header_size), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  }
  out.close();
  if (!out) return absl::UnavailableError(StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace lmserve::engine
