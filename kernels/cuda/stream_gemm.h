// The linear layer of decode steps, y[m, n] = x[m, k] W[n, k]^T for m <= kMaxStreamGemmRows tokens,
// with W streamed once from memory (CPU twin: kernels/cpu/linear.h; with silu_and_mul,
// kernels/cpu/activation.h after it).
//
// A decode step's GEMMs read every weight once and do little arithmetic per byte: their time is
// W's bytes over the memory bandwidth, plus whatever the kernel loses at its start, at its end and
// between the short kernels of the step. This kernel is built to lose little of each:
// - A persistent grid (a block per multiprocessor) takes work units: a tile of W's rows over all
//   of k, or, for the tiles left over after whole waves, over a share of k (split-K), so that every
//   block streams about the same number of bytes. Split tiles are summed in a fixed order by
//   whichever block finishes a tile last (deterministic, no second kernel).
// - One producer warp streams W and x through a ring of shared-memory stages with the bulk tensor
//   copy engine (TMA, 128-byte swizzle) completing on mbarriers; four consumer warps run mma.sync
//   m16n8k16 with W's rows as the M operand and the tokens as N (8 to 64), fp32 accumulators.
// - Weights do not depend on the previous kernel: with programmatic dependent launch
//   (common.cuh), each block fills its ring with W before it waits for its predecessor, so up to
//   ~100 KB per multiprocessor (m <= 16) of the weights arrive while the previous kernel runs.
// bf16 x and W; y in bf16 or fp32 (logits); fp32 accumulation.

#ifndef LMSERVE_KERNELS_CUDA_STREAM_GEMM_H_
#define LMSERVE_KERNELS_CUDA_STREAM_GEMM_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int64_t kMaxStreamGemmRows = 64;

// A TMA descriptor of one operand, a row-major bf16 matrix [rows, cols] with a row stride of
// `stride` elements, made once on the host (weights at load, an activation buffer per row count)
// and passed to the kernel by value. REQUIRES of the matrix: 16-byte aligned, stride a multiple
// of 8. The device memory must outlive every launch that uses the descriptor.
struct StreamGemmOperand {
  CUtensorMap map;       // boxes of 16 rows (8 for gate/up pairs; m rows for x)
  CUtensorMap map_wide;  // W only: boxes of 64 rows (the warpgroup-MMA kernels)
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  enum class Kind { kWeights, kGateUpWeights, kInput } kind = Kind::kWeights;

  // W [n, k]: rows are output features. `gate_up`: the fused [gate; up] projection, for the
  // SiLU-and-mul epilogue (and only for it: its descriptor reads rows in gate/up pairs of 8).
  static absl::StatusOr<StreamGemmOperand> Weights(const void* w, int64_t n, int64_t k,
                                                   bool gate_up = false);
  // x [m, k] with row stride `stride` (0: k), m in [1, kMaxStreamGemmRows].
  static absl::StatusOr<StreamGemmOperand> Input(const void* x, int64_t m, int64_t k,
                                                 int64_t stride = 0);
};

struct StreamGemmParams {
  const StreamGemmOperand* w = nullptr;  // [n, k]: Weights(); host memory
  const StreamGemmOperand* x = nullptr;  // [m, k]: Input() with the same k; host memory
  void* y = nullptr;  // [m, n], or [m, n / 2] with silu_and_mul; row stride y_stride; device
  int64_t y_stride = 0;               // elements; 0 means a row (n, or n / 2)
  DType output_dtype = DType::kBF16;  // kBF16 or kF32
  // The MLP's activation as the epilogue: W is the fused [gate; up] projection (rows [0, n/2) the
  // gate, [n/2, n) the up rows; its descriptor made with gate_up) and y[t, j] = silu(gate[t, j])
  // * up[t, j], with gate and up rounded to bf16 first, as a separate SiLU-and-mul kernel
  // (activation.h) would see them. n must be even; the output type must be bf16.
  bool silu_and_mul = false;
  // StreamGemmWorkspaceBytes() bytes of device memory, zero-filled before its first launch (the
  // kernel leaves it so). Launches on one stream may share it; concurrent launches may not.
  void* workspace = nullptr;

  absl::Status Validate() const;
};

// The workspace any launch on the current device needs (split-K partial sums and tile counters).
int64_t StreamGemmWorkspaceBytes();

cudaError_t Launch(const StreamGemmParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_STREAM_GEMM_H_
