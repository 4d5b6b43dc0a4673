// The linear layer for a few tokens (decode steps of small batches): y[m, n] = x[m, k] W[n, k]^T
// with m <= kMaxSkinnyGemmRows, on the GPU (CPU twin: kernels/cpu/linear.h).
//
// Such a product only streams W once: its time is W's bytes over the memory bandwidth. A warp
// takes two rows of W and walks them in 16-byte pieces with several loads in flight, multiplying
// each piece with the m rows of x (small, read through L1), and keeps m x 2 fp32 sums that a warp
// reduction finishes. cuBLASLt's kernels for m = 1..8 are GEMM tilings that leave part of the
// bandwidth unused; the runner times both at start-up and keeps the faster per shape. With
// silu_and_mul a warp takes a gate row and its up row instead, and writes the gated activation
// (SiLU or GELU-tanh: `activation`).
// bf16 or fp16 x and W; y in the same type or fp32 (logits).

#ifndef LMSERVE_KERNELS_CUDA_SKINNY_GEMM_H_
#define LMSERVE_KERNELS_CUDA_SKINNY_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int64_t kMaxSkinnyGemmRows = 8;
// The largest k of the folded add + RMSNorm (SkinnyGemmParams::add_norm_residual): its row is
// held in shared memory, 2 bytes an element.
inline constexpr int64_t kMaxSkinnyAddNormK = 16384;

// The most partial sums the norm epilogue (SkinnyGemmParams::norm_partials) takes a row.
inline constexpr int kMaxSkinnyNormPartials = 512;

struct SkinnyGemmParams {
  const void* x = nullptr;  // [m, k], row stride x_stride; device, 16-byte aligned
  const void* w = nullptr;  // [n, k], contiguous; device, 16-byte aligned
  void* y = nullptr;        // [m, n], row stride y_stride; device
  int64_t m = 0;            // 1 .. kMaxSkinnyGemmRows
  int64_t n = 0;            // even
  int64_t k = 0;            // multiple of 8
  int64_t x_stride = 0;     // multiple of 8; 0 means k
  int64_t y_stride = 0;     // 0 means n
  DType input_dtype = DType::kBF16;   // of x and W: kBF16 or kF16
  DType output_dtype = DType::kBF16;  // input_dtype or kF32
  // The MLP's activation as the epilogue: W is the fused [gate; up] projection (rows [0, n/2) the
  // gate, [n/2, n) the up rows), and y[m, n/2] = act(gate) * up (act: `activation`), each
  // product rounded to the input type first as a separate SiLU-and-mul kernel (activation.h)
  // would see it. y_stride then counts n/2 columns; the output type must be the input type.
  bool silu_and_mul = false;
  GateActivation activation = GateActivation::kSilu;  // act() of the epilogue, with silu_and_mul
  // When the next kernel may launch (programmatic dependent launch, common.cuh): once every warp
  // has read its share of W (late), or right after the wait, as most kernels do.
  bool late_dependents = true;
  // Before its wait for the previous kernel, the kernel asks L2 for up to this many bytes of W
  // (cp.async.bulk.prefetch.L2, sm_90; nothing elsewhere): first the rows of the blocks past
  // the first wave of resident ones, if they fit (they would start only as others finish, the
  // kernel's tail: Mamba-2-2.7B's in_proj at one row is 661 blocks where 528 are resident), then
  // what is left spread evenly over the rows, past the pieces each warp loads into registers
  // there. A kernel launched while a short, latency-bound one runs (programmatic dependent
  // launch) so keeps the memory busy, and its W then comes from L2. 0: none. Keep it well under
  // the L2's size.
  int64_t l2_prefetch_bytes = 0;
  // Two warps a pair of W's rows, each over half of k (one row of x, no activation, n a multiple
  // of 8, k / 2 at least 1024): 2 always where the shape allows; 0 where also the grid would
  // make fewer than 2 blocks a multiprocessor (a short, wide product: more loads in flight);
  // 1 never. No L2 prefetch then.
  int k_split = 1;
  // Mamba-2's gated RMSNorm applied in the epilogue (the decode kernel's fused form, ssm.h): x
  // holds weight * v (v = y * silu(z)) and norm_partials[t * num_norm_partials + j] the partial
  // sums of v^2 of row t; y[t] = rsqrt(sum / norm_width + norm_epsilon) * (x[t] W^T). Null: none.
  // One row (m 1), at most kMaxSkinnyNormPartials partials; not with silu_and_mul.
  const float* norm_partials = nullptr;
  int64_t num_norm_partials = 0;
  int64_t norm_width = 0;
  float norm_epsilon = 0.0f;
  // The add + RMSNorm before the product folded into it (decode steps of one token: one norm
  // kernel fewer between two products): x is the norm's addend, added to the fp32 residual as
  // the kernel reads it, h = add_norm_residual + x, and y = rsqrt(mean(h^2) + add_norm_epsilon) *
  // ((h * add_norm_weight) W^T). Each block computes h * add_norm_weight into shared memory
  // (rounded to the input type) and the sum of h^2 itself: no reduction across blocks. The
  // residual is not written (settle_residual, in a later product, adds x into it). One row, y in
  // the input type, k at most kMaxSkinnyAddNormK, no norm epilogue (silu_and_mul allowed: the
  // scale applies to the gate and the up rows before the activation); k is not split.
  // Null: none.
  const float* add_norm_residual = nullptr;  // [k], fp32; device, 16-byte aligned
  const void* add_norm_weight = nullptr;     // [k], the input type; device, 16-byte aligned
  float add_norm_epsilon = 0.0f;
  // Before its wait for the previous kernel, each warp adds its rows' values of y as they are
  // (what a folded add + RMSNorm left unadded, when y is its addend) into settle_residual, then
  // the kernel overwrites y. Every kernel that reads the residual before must have completed by
  // the time this one launches (common.cuh's chain does that). One row, y in the input type, no
  // silu_and_mul, not with add_norm_residual. Null: none.
  float* settle_residual = nullptr;  // [n], fp32; device

  absl::Status Validate() const;
};

cudaError_t Launch(const SkinnyGemmParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_SKINNY_GEMM_H_
