#include "engine/runner/cuda/cuda_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/runner/dummy_weights.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/quant_gemm.h"
#include "kernels/cuda/random_fill.h"

namespace lmserve::engine::cuda {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The segments of `spec` held in blocks of `part_types` (one a part; empty: none), their data
// at offsets from 0 (each 256-byte aligned, in row order).
std::vector<BlockSegment> Segments(const WeightSpec& spec, const std::vector<DType>& part_types) {
  std::vector<BlockSegment> segments;
  int64_t row = 0, offset = 0;
  for (size_t p = 0; p < part_types.size() && p < spec.parts.size(); ++p) {
    if (segments.empty() || segments.back().type != part_types[p]) {
      if (!segments.empty()) {
        const BlockSegment& last = segments.back();
        offset += Align256(kc::QuantMatrixBytes(last.type, last.rows, spec.cols));
      }
      segments.push_back({.type = part_types[p],
                          .data = reinterpret_cast<const void*>(offset),
                          .first_row = row,
                          .rows = 0});
    }
    segments.back().rows += spec.parts[p].rows;
    row += spec.parts[p].rows;
  }
  return segments;
}

// The bytes of `spec`'s storage: FP8 bytes then scales, the device layouts of its GGUF block
// segments, or elements of element_bytes.
int64_t StorageBytes(const WeightSpec& spec, int64_t element_bytes, bool f8,
                     const std::vector<DType>& part_types) {
  if (f8) return Align256(spec.rows * spec.cols) + Align256(spec.rows * int64_t{sizeof(float)});
  if (!part_types.empty()) {
    int64_t bytes = 0;
    for (const BlockSegment& segment : Segments(spec, part_types)) {
      bytes += Align256(kc::QuantMatrixBytes(segment.type, segment.rows, spec.cols));
    }
    return bytes;
  }
  return Align256(spec.num_elements() * element_bytes);
}

const std::vector<DType>& PartTypesAt(const BlockTypes& block_types, size_t index) {
  static const std::vector<DType> kNone;
  return index < block_types.size() ? block_types[index] : kNone;
}

}  // namespace

bool IsF8Linear(const WeightSpec& spec) {
  if (!spec.is_matrix() || spec.tied_to.present() || spec.rows % 16 != 0 || spec.cols % 16 != 0) {
    return false;
  }
  for (const char* kind :
       {"qkv", "o_proj", "gate_up", "down_proj", "ssm_in_proj", "ssm_out_proj"}) {
    if (spec.kind == kind) return true;
  }
  return false;
}

bool IsQuantLinear(const WeightSpec& spec) {
  if (!spec.is_matrix() || spec.tied_to.present() || spec.offset != 0) return false;
  for (const char* kind : {"qkv", "o_proj", "gate_up", "down_proj"}) {
    if (spec.kind == kind) return true;
  }
  return false;
}

BlockTypes ChooseBlockTypes(const WeightPlan& plan, const Checkpoint& checkpoint,
                            RunnerQuantization quantization, LoadFormat format) {
  BlockTypes types(static_cast<size_t>(plan.size()));
  const std::optional<DType> dummy_type = RunnerQuantizationBlockType(quantization);
  const bool keep_file_blocks =
      quantization == RunnerQuantization::kGguf && format == LoadFormat::kCheckpoint;
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (!IsQuantLinear(spec) || spec.parts.empty()) continue;
    if (!dummy_type.has_value() &&
        (!keep_file_blocks || (spec.tensor_parallel_size > 1 && spec.split != Split::kReplicated &&
                               spec.split != Split::kRows))) {
      continue;
    }
    std::vector<DType> part_types;
    for (const WeightPart& part : spec.parts) {
      std::optional<DType> type = dummy_type;
      if (!type.has_value()) {
        const auto it = checkpoint.tensors().find(part.name);
        if (it != checkpoint.tensors().end()) type = it->second.dtype;
      }
      if (!type.has_value() || !kc::SupportsQuantWeights(*type) ||
          !kc::CheckQuantMatrix(*type, part.rows, spec.cols).ok()) {
        part_types.clear();
        break;
      }
      part_types.push_back(*type);
    }
    const bool gated = spec.kind == "gate_up";
    if (gated && !part_types.empty() &&
        std::count(part_types.begin(), part_types.end(), part_types[0]) !=
            static_cast<std::ptrdiff_t>(part_types.size())) {
      part_types.clear();
    }
    types[i] = std::move(part_types);
  }
  return types;
}

int64_t CudaWeights::Bytes(const WeightPlan& plan, DType dtype, bool fp8,
                           const BlockTypes& block_types) {
  int64_t total = 0;
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (spec.tied_to.present()) continue;
    total += StorageBytes(spec, dtype == DType::kF32 ? 4 : 2, fp8 && IsF8Linear(spec),
                          PartTypesAt(block_types, i));
  }
  return total;
}

bool CudaWeights::HoldsBlocks() const {
  for (const std::vector<BlockSegment>& segments : segments_) {
    if (!segments.empty()) return true;
  }
  return false;
}

const BlockSegment* CudaWeights::SegmentOf(const WeightSpec& spec, int64_t row) const {
  for (const BlockSegment& segment : segments_[Index(spec)]) {
    if (row >= segment.first_row && row < segment.first_row + segment.rows) return &segment;
  }
  return nullptr;
}

absl::StatusOr<CudaWeights> CudaWeights::Allocate(const WeightPlan& plan, DType dtype, bool fp8,
                                                  const BlockTypes& block_types,
                                                  cudaStream_t stream) {
  CudaWeights weights;
  weights.plan_ = &plan;
  weights.dtype_ = dtype;
  weights.element_bytes_ = dtype == DType::kF32 ? 4 : 2;
  weights.fp8_ = fp8 && dtype == DType::kBF16;
  weights.stream_ = stream;
  weights.segments_.resize(static_cast<size_t>(plan.size()));
  weights.offsets_.assign(static_cast<size_t>(plan.size()), 0);
  int64_t total = 0;
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (spec.tied_to.present()) continue;
    weights.offsets_[i] = total;
    const std::vector<DType>& part_types = PartTypesAt(block_types, i);
    if (!part_types.empty() && (weights.fp8_ || dtype != DType::kBF16)) {
      return absl::InvalidArgumentError(
          "CUDA runner: GGUF blocks are held in bfloat16 runners without FP8 only");
    }
    weights.segments_[i] = Segments(spec, part_types);
    total += StorageBytes(spec, weights.element_bytes_, weights.IsF8(spec), part_types);
  }
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (spec.tied_to.present()) weights.offsets_[i] = weights.offsets_[spec.tied_to.index];
  }
  LMSERVE_ASSIGN_OR_RETURN(weights.buffer_, CudaBuffer::Device(total, "the weights"));
  for (int32_t i = 0; i < plan.size(); ++i) {  // the segments' offsets become addresses
    for (BlockSegment& segment : weights.segments_[i]) {
      segment.data =
          weights.buffer_.at(weights.offsets_[i] + reinterpret_cast<intptr_t>(segment.data));
    }
  }
  return weights;
}

void* CudaWeights::Rows(const WeightSpec& spec, int64_t first_row) const {
  const int64_t element_bytes = IsF8(spec) ? 1 : element_bytes_;
  return buffer_.at(offsets_[Index(spec)] +
                    first_row * std::max<int64_t>(spec.cols, 1) * element_bytes);
}

float* CudaWeights::RowScales(const WeightSpec& spec, int64_t first_row) const {
  return static_cast<float*>(buffer_.at(offsets_[Index(spec)] + Align256(spec.rows * spec.cols))) +
         first_row;
}

const float* CudaWeights::Scales(Weight weight) const {
  const WeightSpec& spec = plan_->specs()[plan_->Storage(weight).index];
  return IsF8(spec) ? RowScales(spec, 0) : nullptr;
}

absl::Status CudaWeights::QuantizeRows(const WeightSpec& spec, int64_t first_row, int64_t rows,
                                       const void* bf16, const std::string& name) {
  const kc::F8QuantizeRowsParams quantize{.src = bf16,
                                          .dst = Rows(spec, first_row),
                                          .scales = RowScales(spec, first_row),
                                          .rows = rows,
                                          .cols = spec.cols,
                                          .src_dtype = DType::kBF16};
  LMSERVE_RETURN_IF_ERROR(quantize.Validate());
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(quantize, stream_), StrCat("quantizing ", name));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("quantizing ", name));
  return absl::OkStatus();
}

absl::Status CudaWeights::StoreF8(const WeightSpec& spec, int64_t first_row,
                                  const TensorView& tensor, const std::vector<float>& row_scales) {
  const int64_t rows = tensor.shape.empty() ? 0 : tensor.shape[0];
  if (!IsF8(spec) || tensor.dtype != DType::kF8E4M3 ||
      tensor.num_bytes != rows * spec.cols || static_cast<int64_t>(row_scales.size()) != rows ||
      first_row + rows > spec.rows) {
    return absl::InternalError(StrCat("CUDA runner: FP8 tensor ", tensor.name,
                                      " does not fit its storage ", spec.name));
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(Rows(spec, first_row), tensor.data, static_cast<size_t>(tensor.num_bytes),
                      cudaMemcpyHostToDevice, stream_),
      StrCat("uploading ", tensor.name));
  LMSERVE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(RowScales(spec, first_row), row_scales.data(),
                      row_scales.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
      StrCat("uploading the scales of ", tensor.name));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("uploading ", tensor.name));
  return absl::OkStatus();
}

absl::Status CudaWeights::StoreDummy(const WeightSpec& spec, int64_t first_row,
                                     const WeightPart& part) {
  const DummyRange range = DummyWeightRange(part.name, spec.fan_in());
  if (const BlockSegment* segment = SegmentOf(spec, first_row); segment != nullptr) {
    const kc::QuantDummyFillParams fill{
        .dst = const_cast<void*>(segment->data),
        .dtype = segment->type,
        .matrix_rows = segment->rows,
        .cols = spec.cols,
        .first_row = first_row - segment->first_row,
        .rows = part.rows,
        .high = std::max(std::fabs(range.low), std::fabs(range.high)),
        .seed = DummyTensorSeed(part.name)};
    LMSERVE_RETURN_IF_ERROR(fill.Validate());
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(fill, stream_), StrCat("dummy blocks of ", part.name));
    return absl::OkStatus();
  }
  CudaBuffer staging;
  if (IsF8(spec)) {  // drawn in bf16, then quantized
    LMSERVE_ASSIGN_OR_RETURN(staging,
                             CudaBuffer::Device(part.rows * spec.cols * 2, "dummy FP8 staging"));
  }
  const kc::RandomFillParams fill{.output = IsF8(spec) ? staging.get() : Rows(spec, first_row),
                                  .num_elements = part.rows * std::max<int64_t>(spec.cols, 1),
                                  .low = range.low,
                                  .high = range.high,
                                  .seed = DummyTensorSeed(part.name),
                                  .dtype = dtype_};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(fill, stream_), StrCat("dummy values of ", part.name));
  if (IsF8(spec)) return QuantizeRows(spec, first_row, part.rows, staging.get(), part.name);
  return absl::OkStatus();
}

absl::Status CudaWeights::Store(const WeightSpec& spec, int64_t first_row, const TensorView& t) {
  const std::string& name = t.name;
  if (const BlockSegment* segment = SegmentOf(spec, first_row); segment != nullptr) {
    // The file's blocks as they are, regrouped into the segment's device layout.
    const int64_t rows = t.shape.empty() ? 0 : t.shape[0];
    if (t.dtype != segment->type || t.num_bytes != rows * kernels::RowBytes(t.dtype, spec.cols)) {
      return absl::InternalError(StrCat("CUDA runner: tensor ", name, " (",
                                        kernels::DTypeName(t.dtype), ") does not fit its ",
                                        kernels::DTypeName(segment->type), " storage ", spec.name));
    }
    LMSERVE_ASSIGN_OR_RETURN(CudaBuffer staging,
                             CudaBuffer::Device(t.num_bytes, StrCat("staging ", name)));
    LMSERVE_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(staging.get(), t.data, static_cast<size_t>(t.num_bytes),
                        cudaMemcpyHostToDevice, stream_),
        StrCat("uploading ", name));
    const kc::QuantRepackParams repack{.src = staging.get(),
                                       .dst = const_cast<void*>(segment->data),
                                       .dtype = segment->type,
                                       .matrix_rows = segment->rows,
                                       .cols = spec.cols,
                                       .first_row = first_row - segment->first_row,
                                       .rows = rows};
    LMSERVE_RETURN_IF_ERROR(repack.Validate());
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(repack, stream_), StrCat("repacking ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("repacking ", name));
    return absl::OkStatus();
  }
  if (IsF8(spec)) {
    // In bf16 first (the path below, into a staging buffer), then quantized per row.
    const int64_t rows = t.NumElements() / spec.cols;
    LMSERVE_ASSIGN_OR_RETURN(CudaBuffer staging,
                             CudaBuffer::Device(rows * spec.cols * 2, StrCat("staging ", name)));
    LMSERVE_RETURN_IF_ERROR(StoreAs(staging.get(), DType::kBF16, t));
    return QuantizeRows(spec, first_row, rows, staging.get(), name);
  }
  return StoreAs(Rows(spec, first_row), dtype_, t);
}

absl::Status CudaWeights::StoreAs(void* dst, DType dtype, const TensorView& t) const {
  const std::string& name = t.name;
  const int64_t elements = t.NumElements();
  const int64_t element_bytes = dtype == DType::kF32 ? 4 : 2;
  if (t.dtype == dtype) {  // already in the runner's dtype: copy as is
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, t.data, static_cast<size_t>(t.num_bytes),
                                                 cudaMemcpyHostToDevice, stream_),
                                 StrCat("uploading ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
    return absl::OkStatus();
  }
  // Upload the file's bytes to a staging buffer and convert them on the GPU.
  LMSERVE_ASSIGN_OR_RETURN(CudaBuffer staging,
                           CudaBuffer::Device(t.num_bytes, StrCat("staging ", name)));
  const kc::DequantizeParams convert{.src = staging.get(),
                                     .dst = dst,
                                     .num_elements = elements,
                                     .dtype = t.dtype,
                                     .output_dtype = dtype};
  if (convert.Validate().ok()) {
    LMSERVE_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(staging.get(), t.data, static_cast<size_t>(t.num_bytes),
                        cudaMemcpyHostToDevice, stream_),
        StrCat("uploading ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(convert, stream_), StrCat("converting ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("converting ", name));
    return absl::OkStatus();
  }
  // Shapes the GPU converter does not take (a count off its block multiple): on the host.
  std::vector<float> f32(static_cast<size_t>(elements));
  kernels::DequantizeToF32(t.dtype, t.data, f32.data(), elements);
  std::vector<uint16_t> bf16;
  const void* host = f32.data();
  if (dtype == DType::kBF16) {
    bf16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) bf16[i] = kernels::F32ToBf16(f32[i]);
    host = bf16.data();
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(dst, host, static_cast<size_t>(elements * element_bytes),
                      cudaMemcpyHostToDevice, stream_),
      StrCat("uploading ", name));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
  return absl::OkStatus();
}

}  // namespace lmserve::engine::cuda
