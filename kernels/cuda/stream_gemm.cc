// The host side of the stream GEMM (stream_gemm.h): TMA descriptors, validation, workspace.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/stream_gemm.h"
#include "kernels/cuda/stream_gemm_schedule.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr const char* kName = "StreamGemm";

// cuTensorMapEncodeTiled from the driver, found through the runtime (the driver library is not
// linked: a CUDA build must start where no driver is installed).
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &symbol, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      symbol = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(symbol);
  }();
  return fn;
}

// A descriptor of [rows, cols] bf16 elements, row stride `stride`, read in boxes of
// [box_rows, kStreamGemmPieceK] with the 128-byte swizzle.
absl::StatusOr<CUtensorMap> Encode(const void* data, int64_t rows, int64_t cols, int64_t stride,
                                   int box_rows, const char* what) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) {
    return absl::FailedPreconditionError(
        StrCat(kName, ": the CUDA driver has no cuTensorMapEncodeTiled (a GPU driver for CUDA "
                      "12 or newer is needed)"));
  }
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * 2};  // bytes, of dim 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStreamGemmPieceK),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides,
             box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(StrCat(kName, ": cannot describe ", what, " [", rows, ", ",
                                             cols, "] (row stride ", stride,
                                             ") to the copy engine: CUresult ",
                                             static_cast<int>(result)));
  }
  return map;
}

absl::Status CheckOperand(const void* data, int64_t rows, int64_t cols, int64_t stride,
                          const char* what) {
  if (data == nullptr) return KernelError(kName, StrCat(what, " is null"));
  if (!Aligned16(data)) return KernelError(kName, StrCat(what, " must be 16-byte aligned"));
  if (rows <= 0 || cols <= 0 || cols % 8 != 0 || stride < cols || stride % 8 != 0 ||
      rows > (int64_t{1} << 31) - 1 || cols > (int64_t{1} << 31) - 1) {
    return KernelError(kName, StrCat(what, " [", rows, ", ", cols, "] with row stride ", stride,
                                     " is not supported (columns and stride multiples of 8)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StreamGemmOperand> StreamGemmOperand::Weights(const void* w, int64_t n, int64_t k,
                                                             bool gate_up) {
  if (absl::Status s = CheckOperand(w, n, k, k, "W"); !s.ok()) return s;
  if (gate_up && n % 2 != 0) return KernelError(kName, "a gate/up W needs an even n");
  absl::StatusOr<CUtensorMap> map =
      Encode(w, n, k, k, StreamGemmWeightBoxRows(gate_up), "W");
  if (!map.ok()) return map.status();
  absl::StatusOr<CUtensorMap> wide = Encode(w, n, k, k, kStreamGemmWideBoxRows, "W");
  if (!wide.ok()) return wide.status();
  StreamGemmOperand op;
  op.map = *map;
  op.map_wide = *wide;
  op.data = w;
  op.rows = n;
  op.cols = k;
  op.kind = gate_up ? Kind::kGateUpWeights : Kind::kWeights;
  return op;
}

absl::StatusOr<StreamGemmOperand> StreamGemmOperand::Input(const void* x, int64_t m, int64_t k,
                                                           int64_t stride) {
  if (stride == 0) stride = k;
  if (m < 1 || m > kMaxStreamGemmRows) {
    return KernelError(kName, StrCat("m ", m, " outside [1, ", kMaxStreamGemmRows, "]"));
  }
  if (absl::Status s = CheckOperand(x, m, k, stride, "x"); !s.ok()) return s;
  // A box of exactly m rows: the kernel reads no row of x past m.
  absl::StatusOr<CUtensorMap> map = Encode(x, m, k, stride, static_cast<int>(m), "x");
  if (!map.ok()) return map.status();
  StreamGemmOperand op;
  op.map = *map;
  op.data = x;
  op.rows = m;
  op.cols = k;
  op.kind = Kind::kInput;
  return op;
}

absl::Status StreamGemmParams::Validate() const {
  using Kind = StreamGemmOperand::Kind;
  if (w == nullptr || x == nullptr) return KernelError(kName, "no W or x descriptor");
  if (w->kind == Kind::kInput || x->kind != Kind::kInput) {
    return KernelError(kName, "W must come from Weights() and x from Input()");
  }
  if (w->cols != x->cols) {
    return KernelError(kName, StrCat("W [", w->rows, ", ", w->cols, "] and x [", x->rows, ", ",
                                     x->cols, "] disagree on k"));
  }
  if (output_dtype != DType::kBF16 && output_dtype != DType::kF32) {
    return KernelError(kName, "the output type must be bf16 or f32");
  }
  if (silu_and_mul != (w->kind == Kind::kGateUpWeights)) {
    return KernelError(kName, "silu_and_mul goes with a gate/up W descriptor, and only it");
  }
  if (silu_and_mul && output_dtype != DType::kBF16) {
    return KernelError(kName, "silu_and_mul writes bf16");
  }
  const int64_t columns = silu_and_mul ? w->rows / 2 : w->rows;
  if (y == nullptr || (y_stride != 0 && y_stride < columns)) {
    return KernelError(kName, StrCat("y is null or its stride ", y_stride, " is below a row (",
                                     columns, ")"));
  }
  if (workspace == nullptr || !Aligned16(workspace)) {
    return KernelError(kName, "the workspace must be given, 16-byte aligned");
  }
  return absl::OkStatus();
}

int StreamGemmVariant() {
  static const int variant = [] {
    const char* env = std::getenv("LMSERVE_STREAM_GEMM_VARIANT");
    return env != nullptr && std::string_view(env) == "1" ? 1 : 0;
  }();
  return variant;
}

int StreamGemmGridLimit() {
  static std::array<std::atomic<int>, 64> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  if (device < 0 || device >= static_cast<int>(cached.size())) device = 0;
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms <= 0) {
      cudaGetLastError();
      return 1;
    }
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

int64_t StreamGemmWorkspaceBytes() {
  // At most 2 * grid split units (MakeStreamGemmSchedule), each of the largest partial: 128 rows
  // of 64 tokens.
  return kStreamGemmCounterBytes + 2 * int64_t{StreamGemmGridLimit()} * 128 * 64 * 4;
}

}  // namespace lmserve::kernels::cuda
