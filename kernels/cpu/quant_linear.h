// The linear layer y = x W^T (+ bias) (+ y) with W in its checkpoint's type: the GGUF block formats
// (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) and F16 / BF16, never expanded to fp32 in memory.
//
// Quantized W: each input row is quantized per block of 32 to int8 with an fp32 scale (round to
// nearest even, |q| <= 127), and each weight row is unpacked, a few rows at a time, into unsigned
// 8-bit values with per-block (or, for Q6_K, per-16) fp32 scales and mins. Integer dot products
// over four consecutive elements (lanes) are exact; each block adds its lanes, scaled, into 16 fp32
// accumulators with fused multiply-adds:
//
//   lane l of block b:  P = sum of w * a over elements 4l..4l+3  (- offset * sum of a, in int32)
//   A[8 (b mod 2) + l] = fma(float(P), ws[b, l / 4] * as[b], A[...])
//                      (+ fma(float(sum of a), wm[b] * as[b], ...) for types with a min)
//
// and the 16 accumulators are added in one fixed tree. Every path (AVX-512 VNNI, AVX2, the portable
// fallback) computes exactly this, so each gives the same bits as the portable one.
//
// F16 / BF16 W: rows converted to fp32 in a thread's scratch and dotted with the fp32 input in 16
// lanes (element e into lane e mod 16), the same tree at the end.
//
// Rows are split across the threads (ParallelFor); each thread unpacks a few rows and runs every
// token against them, so a prefill chunk reads each weight row once.

#ifndef LMSERVE_KERNELS_CPU_QUANT_LINEAR_H_
#define LMSERVE_KERNELS_CPU_QUANT_LINEAR_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels {

// The instruction sets of the CPU kernels, best last.
enum class SimdPath : uint8_t {
  kAuto,        // the best this CPU has
  kPortable,    // plain C++: the reference, and the fallback on any x86-64 or other CPU
  kAvx2,        // AVX2 + FMA
  kAvx512Vnni,  // AVX-512 F/BW/VL/DQ + VNNI (integer dot products in one instruction)
};

std::string_view SimdPathName(SimdPath path);
// Whether this CPU (and its OS) can run `path`. kAuto and kPortable: always.
bool SimdPathSupported(SimdPath path);
// The best supported path (never kAuto).
SimdPath BestSimdPath();

// Whether QuantLinear takes weights of `dtype` with rows of `cols` elements.
bool QuantLinearSupports(DType dtype, int64_t cols);

// Scratch for the quantized input rows, grown as needed; one per caller (not shared across threads
// that call QuantLinear at the same time).
struct QuantLinearWorkspace {
  std::vector<int8_t> q;         // [tokens, cols]
  std::vector<int8_t> q_low;     // [tokens, cols]: the precise input's low part
  std::vector<int32_t> lanes;    // [tokens, cols / 4]: sums of four consecutive q
  // [tokens, blocks padded to a multiple of 16 with zeros]:
  std::vector<float> scale;      // the blocks' scales
  std::vector<int32_t> total;    // the sums of their q
  std::vector<float> sum;        // scale * total
};

struct QuantLinearParams {
  const void* weight = nullptr;  // [out_features] rows of `dtype`, each RowBytes(dtype, in_features)
  DType dtype = DType::kQ8_0;
  const float* input = nullptr;  // [num_tokens, in_features], row stride input_stride
  const float* bias = nullptr;   // [out_features], or null
  float* output = nullptr;       // [num_tokens, out_features], row stride output_stride
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t input_stride = 0;   // 0 means in_features
  int64_t output_stride = 0;  // 0 means out_features
  bool accumulate = false;    // y += ... instead of y = ...; output may not alias input
  int num_threads = 1;
  SimdPath path = SimdPath::kAuto;
  QuantLinearWorkspace* workspace = nullptr;
  // Quantize each input element in two int8 parts (q * 256 + q_low, steps of 1/256 of the block's
  // int8 step: about 15 bits) and multiply both. false: one int8 part, the form llama.cpp uses,
  // some 20% faster and less accurate. Q6_K always takes one part.
  bool precise_input = true;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void QuantLinear(const QuantLinearParams& params);

// The int8 quantization of one input row of `cols` elements (cols a multiple of 32) that QuantLinear
// applies: q, one scale per 32 and the sums of four consecutive q. For tests.
// With q_low, the two-part form of QuantLinearParams::precise_input: scale is then the low part's
// step (the int8 step / 256) and lanes hold the sums of q * 256 + q_low.
void QuantizeInputRow(const float* x, int64_t cols, int8_t* q, float* scale, int32_t* lanes,
                      int8_t* q_low = nullptr);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_QUANT_LINEAR_H_
