// GGUF-quantized weights held quantized on the GPU (issue 23): Q8_0, Q4_0, Q4_K and Q6_K matrices
// in a device layout of their blocks, the linear layer for a few tokens over them (W8A16 /
// W4A16 / W6A16), and their dequantization to bf16 for larger steps. CPU twin: the GGUF blocks'
// DequantizeToF32 (kernels/cpu/dequant.h) and an fp32 product.
//
// The device layout (QuantMatrixBytes) holds the blocks' own bytes, regrouped so that every load
// is 16-byte aligned (Q8_0's 34-byte and Q4_0's 18-byte blocks, Q6_K's 210-byte super-blocks
// are not): per matrix [rows, cols], with nb = cols / block elements blocks a row,
//   Q8_0: quants int8 [rows, cols]           | d fp16 [rows, nb]
//   Q4_0: quants [rows, nb, 16 bytes]        | d fp16 [rows, nb]      (nibbles as in the block)
//   Q4_K: the blocks as stored [rows, nb, 144 bytes]
//   Q6_K: ql, qh [rows, nb, 128 + 64 bytes]  | scales int8 [rows, nb, 16] | d fp16 [rows, nb]
// each region 256-byte aligned: the bytes of the file's blocks plus at most 512.
// QuantRepack writes it from the file's blocks (GGUF's layout, on the device), QuantDummyFill
// from nothing (--load-format dummy: random quants, scales that give values within +-high).
//
// QuantSkinnyGemm: y[m, n] = x[m, k] W[n, k]^T for m <= kMaxSkinnyGemmRows, x bf16 or fp16 as it
// is, W decoded in registers (the blocks' arithmetic, llama.cpp's), fp32 sums: a warp takes two
// rows of W and walks their blocks in units of 32 or 64 weights a lane (one or two 16-byte
// loads of quants each), several units in flight; its time is W's quantized bytes over the
// memory bandwidth. With silu_and_mul, W is the fused [gate; up] projection and y = act(gate) *
// up (skinny_gemm.h's epilogue).
// Q4_K, Q8_0 and Q6_K at one or two tokens (Q4_K and Q8_0 up to four; QuantSkinnyRoundsX)
// multiply in integers (dp4a), llama.cpp's way for its GPU decode, but with x kept to 16 bits:
// each token's x is first rounded, per 256-element block, to a multiple of 2^(E - 14), E the
// exponent of the block's largest |x| (exact for every element within 2^7 of that one); the
// products of the rounded x are then exact. The rounding adds a relative L2 of about 5e-6 to a
// product of Gaussian x.
// QuantDequantize: W to bf16 [rows, cols], bit-exact with F32ToBf16(DequantizeToF32(blocks)):
// larger steps dequantize a weight into a scratch and run the bf16 GEMM (gemm.h) on it.

#ifndef LMSERVE_KERNELS_CUDA_QUANT_GEMM_H_
#define LMSERVE_KERNELS_CUDA_QUANT_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

// Whether QuantSkinnyGemm over a [n, k] matrix of w_dtype at m tokens rounds x so: k a multiple
// of 256 and x's digits (2 m k bytes) within a block's shared memory beside another block's: up
// to 16384 at one or two tokens; Q4_K and Q8_0 also at three or four where m k <= 32768 (four
// tokens at Llama-3-8B's 4096). (Q6_K at four tokens, and all three at eight, measured slower
// than the float kernel: bench/results section 24.)
constexpr bool QuantSkinnyRoundsX(DType w_dtype, int64_t m, int64_t k) {
  const bool up_to_four =
      (w_dtype == DType::kQ4_K || w_dtype == DType::kQ8_0) && m <= 4 && m * k <= 32768;
  return (w_dtype == DType::kQ4_K || w_dtype == DType::kQ8_0 || w_dtype == DType::kQ6_K) &&
         k % 256 == 0 && k <= 16384 && m >= 1 && (m <= 2 || up_to_four);
}

// Whether a product's integer form streams W through shared memory (quant_gemm.cu's
// IntegerStreamKernel: one block of 16 warps a multiprocessor, each warp taking two rows at a
// time, 32 units of them a pass, two passes in flight): Q4_K at one token
// (QuantSkinnyRoundsX) where the current device lets a block take the shared memory it needs
// (120 KB at k 4096, 148 KB at 16384: Hopper's 227 KB and the A100's 163 KB do; the 99 KB of
// compute capability 8.6 and 8.9 do not, where the products keep their loads in registers), and
// SetQuantSkinnyStreaming has not turned it off.
bool QuantSkinnyStreams(DType w_dtype, int64_t m, int64_t k);
// Whether Q4_K's one-token products may stream (on by default). Off, they take the kernel of the
// GPUs with less shared memory a block, so that tests reach it on the GPUs they have.
// Process-wide (an atomic read at each launch); for tests and benchmarks.
void SetQuantSkinnyStreaming(bool allowed);

// Whether matrices of `dtype` may be held quantized on the GPU (Q8_0, Q4_0, Q4_K, Q6_K).
bool SupportsQuantWeights(DType dtype);
// OK if a [rows, cols] matrix of `dtype` may be held quantized: a supported type, cols a
// multiple of its block (32 or 256), rows even (the skinny kernel's row pairs).
absl::Status CheckQuantMatrix(DType dtype, int64_t rows, int64_t cols);
// Bytes of the device layout of a [rows, cols] matrix. REQUIRES: CheckQuantMatrix is OK.
int64_t QuantMatrixBytes(DType dtype, int64_t rows, int64_t cols);

// The file's blocks of rows [first_row, first_row + rows) into the device layout of the whole
// matrix.
struct QuantRepackParams {
  const void* src = nullptr;  // [rows, cols] in GGUF's block layout; device, any alignment
  void* dst = nullptr;        // the matrix's device layout; device, 256-byte aligned
  DType dtype = DType::kQ4_K;
  int64_t matrix_rows = 0;  // of dst
  int64_t cols = 0;
  int64_t first_row = 0;
  int64_t rows = 0;

  absl::Status Validate() const;
};
cudaError_t Launch(const QuantRepackParams& params, cudaStream_t stream);

// Random quants for rows [first_row, first_row + rows) of the matrix at dst, deterministic in
// `seed`, with scales that keep every value within about +-high.
struct QuantDummyFillParams {
  void* dst = nullptr;  // the matrix's device layout; device, 256-byte aligned
  DType dtype = DType::kQ4_K;
  int64_t matrix_rows = 0;
  int64_t cols = 0;
  int64_t first_row = 0;
  int64_t rows = 0;
  float high = 0.05f;  // > 0
  uint64_t seed = 0;

  absl::Status Validate() const;
};
cudaError_t Launch(const QuantDummyFillParams& params, cudaStream_t stream);

struct QuantDequantizeParams {
  const void* w = nullptr;  // the device layout of a [rows, cols] matrix of dtype; device
  void* dst = nullptr;      // [rows, cols] bf16; device, 16-byte aligned
  DType dtype = DType::kQ4_K;
  int64_t rows = 0;
  int64_t cols = 0;

  absl::Status Validate() const;
};
cudaError_t Launch(const QuantDequantizeParams& params, cudaStream_t stream);

struct QuantSkinnyGemmParams {
  const void* x = nullptr;  // [m, k] of input_dtype, row stride x_stride; device, 16-byte aligned
  const void* w = nullptr;  // the device layout of W [n, k] of w_dtype; device, 256-byte aligned
  DType w_dtype = DType::kQ4_K;
  void* y = nullptr;                  // [m, n] of output_dtype, row stride y_stride; device
  int64_t m = 0;                      // 1 .. kMaxSkinnyGemmRows (skinny_gemm.h)
  int64_t n = 0;                      // even
  int64_t k = 0;                      // a multiple of w_dtype's block
  int64_t x_stride = 0;               // multiple of 8; 0 means k
  int64_t y_stride = 0;               // 0 means n (n / 2 with silu_and_mul)
  DType input_dtype = DType::kBF16;   // of x: kBF16
  DType output_dtype = DType::kBF16;  // input_dtype or kF32
  // As SkinnyGemmParams: y[m, n/2] = act(gate) * up, each rounded to the input type first.
  bool silu_and_mul = false;
  GateActivation activation = GateActivation::kSilu;
  bool late_dependents = true;  // as SkinnyGemmParams::late_dependents
  // As SkinnyGemmParams (skinny_gemm.h): the add + RMSNorm before the product folded in, and the
  // residual's add that such a fold leaves, settled before the wait. Both at one row on the
  // integer products only (QuantSkinnyRoundsX(w_dtype, 1, k)), y in the input type; the fold
  // with silu_and_mul too, the settle without. The fold's row is rounded to bf16 before x's
  // digits (h * weight, the norm's scale applied to the sums, as the other skinny kernels do).
  // Null: none.
  const float* add_norm_residual = nullptr;  // [k], fp32; device, 16-byte aligned
  const void* add_norm_weight = nullptr;     // [k] of input_dtype; device, 16-byte aligned
  float add_norm_epsilon = 0.0f;
  float* settle_residual = nullptr;  // [n], fp32; device

  absl::Status Validate() const;
};
cudaError_t Launch(const QuantSkinnyGemmParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_QUANT_GEMM_H_
