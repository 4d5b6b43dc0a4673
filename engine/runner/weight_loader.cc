#include "engine/runner/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cpu/dequant.h"

namespace lmserve::engine {
namespace {

// This rank's slice of `full`, the checkpoint tensor of a part of a split tensor
// (WeightSpec::split), in `storage`: rows keep the file's element type (quantized rows are whole
// blocks); a column slice of a quantized tensor is dequantized to fp32 first.
absl::StatusOr<TensorView> RankSlice(const WeightSpec& spec, const WeightPart& part,
                                     const TensorView& full, std::vector<std::byte>* storage) {
  const int64_t n = spec.tensor_parallel_size, rank = spec.tensor_parallel_rank;
  const int64_t full_rows = full.shape[0];
  TensorView slice = full;
  slice.shape = spec.PartShape(part);
  if (spec.split == Split::kRows || spec.split == Split::kVocab) {
    if (full.num_bytes % full_rows != 0) {
      return absl::InvalidArgumentError(StrCat(full.file, ": tensor ", full.name, " ",
                                               full.ShapeString(), " cannot be split by rows"));
    }
    const int64_t row_bytes = full.num_bytes / full_rows;
    storage->assign(static_cast<size_t>(part.rows * row_bytes), std::byte{0});
    if (spec.split == Split::kVocab) {  // rows [rank * rows, ...), the rest zero padding
      const int64_t first = std::min(rank * part.rows, full_rows);
      const int64_t count = std::min(part.rows, full_rows - first);
      std::memcpy(storage->data(), full.data + first * row_bytes,
                  static_cast<size_t>(count * row_bytes));
    } else {  // the rank's slice of each segment, the segments one after another
      const std::vector<RowSlices> segments =
          part.segments.empty() ? std::vector<RowSlices>{RowSlices(part.rows, n)} : part.segments;
      int64_t source_row = 0, row = 0;
      for (const RowSlices& segment : segments) {
        const int64_t slices = segment.slices > 0 ? segment.slices : n;
        std::memcpy(storage->data() + row * row_bytes,
                    full.data + (source_row + rank * slices / n * segment.rows) * row_bytes,
                    static_cast<size_t>(segment.rows * row_bytes));
        source_row += slices * segment.rows;
        row += segment.rows;
      }
    }
  } else {  // Split::kCols: columns [rank * cols, (rank + 1) * cols) of every row
    const int64_t cols = spec.cols, full_cols = full.shape[1];
    if (kernels::IsQuantized(full.dtype)) {
      std::vector<float> values(static_cast<size_t>(full.NumElements()));
      kernels::DequantizeToF32(full.dtype, full.data, values.data(), full.NumElements());
      storage->resize(static_cast<size_t>(part.rows * cols) * sizeof(float));
      float* out = reinterpret_cast<float*>(storage->data());
      for (int64_t r = 0; r < part.rows; ++r) {
        std::copy_n(values.data() + r * full_cols + rank * cols, cols, out + r * cols);
      }
      slice.dtype = kernels::DType::kF32;
    } else {
      const int64_t element_bytes = kernels::RowBytes(full.dtype, 1);
      storage->resize(static_cast<size_t>(part.rows * cols * element_bytes));
      for (int64_t r = 0; r < part.rows; ++r) {
        std::memcpy(storage->data() + r * cols * element_bytes,
                    full.data + (r * full_cols + rank * cols) * element_bytes,
                    static_cast<size_t>(cols * element_bytes));
      }
    }
  }
  slice.data = storage->data();
  slice.num_bytes = static_cast<int64_t>(storage->size());
  return slice;
}

}  // namespace

absl::Status WeightSink::StoreF8(const WeightSpec& spec, int64_t, const TensorView&,
                                 const std::vector<float>&) {
  return absl::InternalError(StrCat("this runner holds no FP8 weights (", spec.name, ")"));
}

absl::StatusOr<F8Scales> ReadF8Scales(const Checkpoint& checkpoint, const TensorView& tensor) {
  const Fp8CheckpointConfig& fp8 = checkpoint.config().fp8;
  if (!fp8.present) {
    return absl::InvalidArgumentError(
        StrCat(tensor.file, ": tensor '", tensor.name,
               "' is F8_E4M3 but config.json has no quantization_config saying how it is scaled"));
  }
  if (tensor.shape.size() != 2) {
    return absl::UnimplementedError(StrCat(tensor.file, ": F8_E4M3 tensor '", tensor.name, "' ",
                                           tensor.ShapeString(), " is not a matrix"));
  }
  const std::string scale_name = fp8.ScaleName(tensor.name);
  const auto it = checkpoint.tensors().find(scale_name);
  if (it == checkpoint.tensors().end()) {
    return absl::InvalidArgumentError(StrCat(tensor.file, ": F8_E4M3 tensor '", tensor.name,
                                             "' has no scales '", scale_name, "' (",
                                             fp8.method, " quantization)"));
  }
  const TensorView& scale = it->second;
  LMSERVE_RETURN_IF_ERROR(CheckTensorBytes(scale));
  if (scale.dtype != kernels::DType::kF32 && scale.dtype != kernels::DType::kBF16 &&
      scale.dtype != kernels::DType::kF16) {
    return absl::UnimplementedError(StrCat(scale.file, ": scales '", scale_name, "' of type ",
                                           kernels::DTypeName(scale.dtype),
                                           " are not supported (F32, BF16, F16)"));
  }
  const int64_t rows = tensor.shape[0], cols = tensor.shape[1], count = scale.NumElements();
  F8Scales out;
  out.values.resize(static_cast<size_t>(count));
  kernels::DequantizeToF32(scale.dtype, scale.data, out.values.data(), count);
  if (fp8.block_rows > 0) {
    out.layout = {fp8.block_rows, fp8.block_cols};
    if (count != out.layout.ScaleRows(rows) * out.layout.ScaleCols(cols)) {
      return absl::InvalidArgumentError(
          StrCat(scale.file, ": scales '", scale_name, "' ", scale.ShapeString(), " do not fit ",
                 tensor.ShapeString(), " in blocks of ", fp8.block_rows, " x ", fp8.block_cols));
    }
    return out;
  }
  out.per_row = true;
  if (count == 1) {  // per tensor: the one value for every row
    out.values.assign(static_cast<size_t>(rows), out.values[0]);
  } else if (count != rows) {
    return absl::InvalidArgumentError(StrCat(scale.file, ": scales '", scale_name, "' ",
                                             scale.ShapeString(), " are neither one value nor one ",
                                             "per output channel of ", tensor.ShapeString()));
  }
  out.layout = kernels::F8ScaleLayout::PerChannel(cols);
  return out;
}

absl::Status LoadWeights(const WeightPlan& plan, const Checkpoint& checkpoint, LoadFormat format,
                         WeightSink& sink) {
  std::vector<std::byte> slice_storage;
  std::vector<float> shifted_values, dequantized_values;
  for (const WeightSpec& spec : plan.specs()) {
    int64_t first_row = 0;
    for (const WeightPart& part : spec.parts) {
      if (format == LoadFormat::kDummy) {
        LMSERVE_RETURN_IF_ERROR(sink.StoreDummy(spec, first_row, part));
        first_row += part.rows;
        continue;
      }
      LMSERVE_ASSIGN_OR_RETURN(const TensorView* file_tensor,
                               checkpoint.Get(part.name, spec.CheckpointShape(part)));
      LMSERVE_RETURN_IF_ERROR(CheckTensorBytes(*file_tensor));
      TensorView tensor = *file_tensor;
      if (tensor.dtype == kernels::DType::kF8E4M3) {
        LMSERVE_ASSIGN_OR_RETURN(F8Scales scales, ReadF8Scales(checkpoint, tensor));
        const bool whole = spec.split == Split::kReplicated || spec.tensor_parallel_size == 1;
        if (scales.per_row && whole && spec.offset == 0 && sink.HoldsF8(spec)) {
          LMSERVE_RETURN_IF_ERROR(sink.StoreF8(spec, first_row, tensor, scales.values));
          checkpoint.DropPages(*file_tensor);
          first_row += part.rows;
          continue;
        }
        // Dequantized on the host; the sink converts fp32 as any other tensor.
        dequantized_values.resize(static_cast<size_t>(tensor.NumElements()));
        kernels::DequantizeF8E4M3(reinterpret_cast<const uint8_t*>(tensor.data), tensor.shape[0],
                                  tensor.shape[1], scales.layout, scales.values.data(),
                                  dequantized_values.data());
        tensor.dtype = kernels::DType::kF32;
        tensor.data = reinterpret_cast<const std::byte*>(dequantized_values.data());
        tensor.num_bytes = static_cast<int64_t>(dequantized_values.size() * sizeof(float));
      }
      if (spec.split != Split::kReplicated && spec.tensor_parallel_size > 1) {
        LMSERVE_ASSIGN_OR_RETURN(tensor, RankSlice(spec, part, tensor, &slice_storage));
      }
      if (spec.offset != 0) {  // Gemma's norms: the offset added in fp32, stored from there
        shifted_values.resize(static_cast<size_t>(tensor.NumElements()));
        kernels::DequantizeToF32(tensor.dtype, tensor.data, shifted_values.data(),
                                 tensor.NumElements());
        for (float& v : shifted_values) v += spec.offset;
        tensor.dtype = kernels::DType::kF32;
        tensor.data = reinterpret_cast<const std::byte*>(shifted_values.data());
        tensor.num_bytes = static_cast<int64_t>(shifted_values.size() * sizeof(float));
      }
      LMSERVE_RETURN_IF_ERROR(sink.Store(spec, first_row, tensor));
      checkpoint.DropPages(*file_tensor);  // copied out: the file's pages need not stay resident
      first_row += part.rows;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KvCacheScales> ReadKvCacheScales(const Checkpoint& checkpoint,
                                                int64_t num_layers) {
  KvCacheScales scales;
  scales.k.assign(static_cast<size_t>(num_layers), 1.0f);
  scales.v.assign(static_cast<size_t>(num_layers), 1.0f);
  const auto& tensors = checkpoint.tensors();
  // The scale of `which` ("k" or "v") of layer `layer`, if the checkpoint has one.
  auto read = [&](int64_t layer, const char* which) -> absl::StatusOr<std::optional<float>> {
    const std::string prefix = StrCat("model.layers.", layer, ".self_attn.");
    for (const std::string& name :
         {StrCat(prefix, which, "_scale"), StrCat(prefix, which, "_proj.output_scale"),
          StrCat(prefix, which, "_proj.", which, "_scale")}) {
      const auto it = tensors.find(name);
      if (it == tensors.end()) continue;
      const TensorView& tensor = it->second;
      LMSERVE_RETURN_IF_ERROR(CheckTensorBytes(tensor));
      if (tensor.NumElements() != 1 ||
          (tensor.dtype != kernels::DType::kF32 && tensor.dtype != kernels::DType::kBF16 &&
           tensor.dtype != kernels::DType::kF16)) {
        return absl::InvalidArgumentError(
            StrCat(tensor.file, ": the KV cache scale '", name, "' ", tensor.ShapeString(), " of ",
                   kernels::DTypeName(tensor.dtype), " is not one F32, BF16 or F16 value"));
      }
      float value = 0;
      kernels::DequantizeToF32(tensor.dtype, tensor.data, &value, 1);
      if (!(value > 0) || !std::isfinite(value)) {
        return absl::InvalidArgumentError(StrCat(tensor.file, ": the KV cache scale '", name,
                                                 "' is ", value, ", not positive and finite"));
      }
      return value;
    }
    return std::nullopt;
  };
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    LMSERVE_ASSIGN_OR_RETURN(std::optional<float> k, read(layer, "k"));
    LMSERVE_ASSIGN_OR_RETURN(std::optional<float> v, read(layer, "v"));
    if (k.has_value()) scales.k[static_cast<size_t>(layer)] = *k;
    if (v.has_value()) scales.v[static_cast<size_t>(layer)] = *v;
    if (k.has_value() || v.has_value()) ++scales.layers_from_checkpoint;
  }
  return scales;
}

}  // namespace lmserve::engine
