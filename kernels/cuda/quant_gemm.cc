// Shapes and Validate() of the quantized-weight kernels (quant_gemm.h).

#include "kernels/cuda/quant_gemm.h"

#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {
namespace {

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

absl::Status CheckLayoutRows(const char* kernel, const void* dst, DType dtype, int64_t matrix_rows,
                             int64_t cols, int64_t first_row, int64_t rows) {
  if (absl::Status s = CheckQuantMatrix(dtype, matrix_rows, cols); !s.ok()) {
    return KernelError(kernel, std::string(s.message()));
  }
  if (first_row < 0 || rows < 0 || first_row + rows > matrix_rows) {
    return KernelError(kernel, StrCat("rows [", first_row, ", ", first_row + rows,
                                      ") are not within the matrix's ", matrix_rows));
  }
  if (rows > 0 && (dst == nullptr || reinterpret_cast<uintptr_t>(dst) % 256 != 0)) {
    return KernelError(kernel, "dst must be a 256-byte aligned device address");
  }
  return absl::OkStatus();
}

}  // namespace

bool SupportsQuantWeights(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_K ||
         dtype == DType::kQ6_K;
}

absl::Status CheckQuantMatrix(DType dtype, int64_t rows, int64_t cols) {
  if (!SupportsQuantWeights(dtype)) {
    return absl::InvalidArgumentError(StrCat("quantized weights of type ", DTypeName(dtype),
                                             " are not held on the GPU (Q8_0, Q4_0, Q4_K, Q6_K)"));
  }
  const int64_t block = GetBlockLayout(dtype).elements_per_block;
  if (rows <= 0 || rows % 2 != 0 || cols <= 0 || cols % block != 0) {
    return absl::InvalidArgumentError(StrCat("a ", DTypeName(dtype), " matrix [", rows, ", ", cols,
                                             "] is not held quantized (rows even, columns a ",
                                             "multiple of ", block, ")"));
  }
  return absl::OkStatus();
}

int64_t QuantMatrixBytes(DType dtype, int64_t rows, int64_t cols) {
  const int64_t blocks = rows * (cols / GetBlockLayout(dtype).elements_per_block);
  switch (dtype) {
    case DType::kQ8_0:
      return Align256(rows * cols) + Align256(blocks * 2);
    case DType::kQ4_0:
      return Align256(rows * cols / 2) + Align256(blocks * 2);
    case DType::kQ4_K:
      return Align256(blocks * 144);
    case DType::kQ6_K:
      return Align256(blocks * 192) + Align256(blocks * 16) + Align256(blocks * 2);
    default:
      return 0;
  }
}

absl::Status QuantRepackParams::Validate() const {
  if (absl::Status s =
          CheckLayoutRows("QuantRepack", dst, dtype, matrix_rows, cols, first_row, rows);
      !s.ok()) {
    return s;
  }
  if (rows > 0 && src == nullptr) return KernelError("QuantRepack", "null src");
  return absl::OkStatus();
}

absl::Status QuantDummyFillParams::Validate() const {
  if (absl::Status s =
          CheckLayoutRows("QuantDummyFill", dst, dtype, matrix_rows, cols, first_row, rows);
      !s.ok()) {
    return s;
  }
  if (!(high > 0.0f) || high > 1e4f)
    return KernelError("QuantDummyFill", "high must be in (0, 1e4]");
  return absl::OkStatus();
}

absl::Status QuantDequantizeParams::Validate() const {
  if (absl::Status s = CheckLayoutRows("QuantDequantize", w, dtype, rows, cols, 0, rows); !s.ok()) {
    return s;
  }
  if (dst == nullptr || !Aligned16(dst)) {
    return KernelError("QuantDequantize", "dst must be a 16-byte aligned device address");
  }
  return absl::OkStatus();
}

absl::Status QuantSkinnyGemmParams::Validate() const {
  if (input_dtype != DType::kBF16) {
    return KernelError("QuantSkinnyGemm",
                       StrCat("input dtype ", DTypeName(input_dtype), " is not supported (bf16)"));
  }
  if (absl::Status s = CheckLayoutRows("QuantSkinnyGemm", w, w_dtype, n, k, 0, n); !s.ok()) {
    return s;
  }
  if (output_dtype != input_dtype && output_dtype != DType::kF32) {
    return KernelError("QuantSkinnyGemm", "the output type must be the input type or f32");
  }
  if (m < 1 || m > kMaxSkinnyGemmRows) {
    return KernelError("QuantSkinnyGemm",
                       StrCat("m ", m, " is not in [1, ", kMaxSkinnyGemmRows, "]"));
  }
  if (activation != GateActivation::kSilu && activation != GateActivation::kGeluTanh) {
    return KernelError("QuantSkinnyGemm",
                       StrCat("unknown activation ", static_cast<int>(activation)));
  }
  if (silu_and_mul && output_dtype != input_dtype) {
    return KernelError("QuantSkinnyGemm", "silu_and_mul writes the input type");
  }
  const int64_t y_columns = silu_and_mul ? n / 2 : n;
  const int64_t xs = x_stride != 0 ? x_stride : k, ys = y_stride != 0 ? y_stride : y_columns;
  if (xs < k || xs % 8 != 0 || ys < y_columns) {
    return KernelError("QuantSkinnyGemm",
                       StrCat("strides x ", xs, ", y ", ys, " are not supported"));
  }
  const bool integer_row =
      m == 1 && QuantSkinnyRoundsX(w_dtype, 1, k) && output_dtype == input_dtype;
  if (add_norm_residual != nullptr &&
      (!integer_row || add_norm_weight == nullptr || !Aligned16(add_norm_residual) ||
       !Aligned16(add_norm_weight))) {
    return KernelError("QuantSkinnyGemm",
                       "the folded add + RMSNorm takes one row of the integer products "
                       "(Q4_K, Q8_0 or Q6_K, k a multiple of 256 up to 16384), y in the input "
                       "type, and an aligned residual and weight");
  }
  if (settle_residual != nullptr &&
      (!integer_row || silu_and_mul || add_norm_residual != nullptr)) {
    return KernelError("QuantSkinnyGemm",
                       "settle_residual takes one row of the integer products, y in the input "
                       "type, no silu_and_mul and no folded add + RMSNorm");
  }
  if (x == nullptr || y == nullptr || !Aligned16(x)) {
    return KernelError("QuantSkinnyGemm", "x (16-byte aligned) and y must be device addresses");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
