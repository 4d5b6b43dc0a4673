// Dense GEMMs through cuBLASLt: y[m, n] = x[m, k] W[n, k]^T, the linear layer with PyTorch's weight
// layout (CPU twin: kernels/cpu/linear.h). bf16 or fp16 inputs, fp32 accumulation, output in the
// input type or fp32 (logits); or fp32 throughout (the runner's float32 mode): fp32 inputs,
// CUBLAS_COMPUTE_32F, and only algorithms that multiply in fp32 on the CUDA cores (no TF32, no
// tensor-core emulation: the plan filters the heuristic's candidates by their numerics).
//
// FP8 (input_dtype kF8E4M3, compute capability 8.9+): x and W both E4M3, each with fp32 scales,
// W's per output channel and x's per row (token), applied by cuBLASLt's outer-vector scaling
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: y[t, j] = s_x[t] s_w[j] sum_c x[t, c] W[j, c]),
// fp32 accumulation, bf16 out. Where cuBLASLt's heuristic refuses outer-vector scales (cuBLAS
// 13.0 on an H100 does), the plan runs the plain FP8 GEMM (unit scales, bf16 out) and then
// F8ScaleOutput (fp8.h), which multiplies y in place by s_x[t] s_w[j]: one more rounding to bf16
// (2^-9 relative) and one more pass over y.
//
// A GemmPlan fixes the shape and chooses the algorithm once: cuBLASLt's heuristic candidates
// (up to 16), each timed on the device when `autotune` (on scratch data), or later by Tune
// on the caller's own operands, the fastest kept; else the heuristic's first. The runner creates
// one plan per (projection, token count) and runs it every step.

#ifndef LMSERVE_KERNELS_CUDA_GEMM_H_
#define LMSERVE_KERNELS_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

// Owns a cuBLASLt handle.
class BlasLtHandle {
 public:
  static absl::StatusOr<std::unique_ptr<BlasLtHandle>> Create();
  ~BlasLtHandle();
  BlasLtHandle(const BlasLtHandle&) = delete;
  BlasLtHandle& operator=(const BlasLtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  explicit BlasLtHandle(cublasLtHandle_t handle) : handle_(handle) {}
  cublasLtHandle_t handle_;
};

struct GemmShape {
  int64_t m = 0;  // rows of x and y (tokens)
  int64_t n = 0;  // output features: rows of W; multiple of 8
  int64_t k = 0;  // input features; multiple of 8
  int64_t x_stride = 0;  // elements between rows of x, multiple of 8; 0 means k
  int64_t y_stride = 0;  // elements between rows of y, multiple of 8; 0 means n
  DType input_dtype = DType::kBF16;   // of x and W: kBF16, kF16, kF32 or kF8E4M3 (n, k and the
                                      // strides then multiples of 16)
  DType output_dtype = DType::kBF16;  // of y: input_dtype or kF32; kBF16 for kF8E4M3

  absl::Status Validate() const;
};

class GemmPlan {
 public:
  // Chooses the algorithm for `shape`. `workspace` (device, workspace_bytes) is used by every
  // Run and must outlive the plan; 32 MiB suits Hopper. With `autotune`, the candidates are timed
  // on `stream` over scratch buffers allocated and freed here.
  static absl::StatusOr<std::unique_ptr<GemmPlan>> Create(cublasLtHandle_t handle,
                                                          const GemmShape& shape, void* workspace,
                                                          size_t workspace_bytes, bool autotune,
                                                          cudaStream_t stream);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  // y = x W^T. x: [m, k] (row stride x_stride), w: [n, k] contiguous, y: [m, n] (row stride
  // y_stride); device, 16-byte aligned. FP8: w_scales [n] and x_scales [m] (device fp32) are
  // W's and x's scales, required; other types ignore them. With `unscaled`, a plan whose scales
  // would be applied by F8ScaleOutput after the GEMM (!fp8_outer_vector_scales()) leaves y
  // unscaled, for the kernel that reads y next to apply them as it reads (SiluAndMulParams's
  // row_scales and col_scales); a plan whose GEMM applies them ignores `unscaled`.
  cublasStatus_t Run(const void* x, const void* w, void* y, cudaStream_t stream,
                     const float* w_scales = nullptr, const float* x_scales = nullptr,
                     bool unscaled = false) const;

  // y += x W^T (beta 1; y is both cuBLASLt's C and D, in the output type): a projection added
  // to an fp32 residual in the epilogue. Not for FP8 plans (CUBLAS_STATUS_INVALID_VALUE).
  cublasStatus_t RunAccumulate(const void* x, const void* w, void* y, cudaStream_t stream) const;

  // Times every heuristic candidate on these operands (y is overwritten; x and w as Run takes
  // them) and keeps the fastest. Not for FP8 plans. REQUIRES: `stream` is not capturing; it
  // synchronizes with the stream.
  absl::Status Tune(const void* x, const void* w, void* y, cudaStream_t stream);
  // Takes `algo` (another plan's, of the same types) if cuBLASLt accepts it for this shape within
  // the workspace; returns whether it did.
  bool TryAlgorithm(const cublasLtMatmulAlgo_t& algo);
  const cublasLtMatmulAlgo_t& algorithm() const { return algo_; }

  const GemmShape& shape() const { return shape_; }
  // FP8: whether cuBLASLt applies the scales itself (else a kernel after it).
  bool fp8_outer_vector_scales() const { return fp8_outer_vector_scales_; }
  int candidates_tried() const { return candidates_tried_; }

 private:
  GemmPlan() = default;
  // Times candidates_ on x and each of `w` in turn (a decode-sized W from memory), keeps the
  // fastest in algo_ and counts them in candidates_tried_.
  absl::Status TimeCandidates(const void* x, const std::vector<const void*>& w, void* y,
                              cudaStream_t stream, const float* w_scales, const float* x_scales);
  GemmShape shape_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulAlgo_t> candidates_;  // the heuristic's, best first
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int candidates_tried_ = 0;
  bool fp8_outer_vector_scales_ = false;
};

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_GEMM_H_
