// The linear layer y = x W^T (+ bias) (+ y) with W in its checkpoint's type: the GGUF block formats
// (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) and F16 / BF16, never expanded to fp32 in memory.
//
// Quantized W: each input row is quantized per block of 32 elements, by default in two int8 parts
// (a = q * 256 + q_low, steps of 1/256 of the int8 step: about 15 bits; precise_input) or in one
// (llama.cpp's form), and each weight row is unpacked, a few rows at a time, into unsigned 8-bit
// values w with one fp32 scale ws per block (Q6_K: one per super-block, times an integer scale c
// per 16 elements) and a min wm per block for the types with one. Then, for each block b:
//
//   I_b = sum of w * a over the block, less offset * sum of a   (int32, exact; Q6_K: lane by lane
//         times c; offset 8 for Q4_0, 128 for Q8_0, 32 for Q6_K)
//   S[b mod 16] = fma(float(I_b), ws_b * scale_b, S[b mod 16])
//   M[b mod 16] = fma(wm_b, scale_b * float(sum of the block's a), M[b mod 16])   (types with a min)
//
// and the result is Reduce(S) + Reduce(M), each a fixed tree over the 16 lanes. Every path
// (AVX-512 VNNI, AVX2, the portable fallback) computes exactly this: the integers are exact, the
// fp32 operations the same in the same order, so each gives the portable path's bits.
//
// F16 / BF16 W: rows converted to fp32 in a thread's scratch and dotted with the fp32 input in 16
// lanes (element e into lane e mod 16), the same tree at the end.
//
// Rows are split across the threads in chunks (ParallelForChunks). Steps of up to 8 tokens read
// Q8_0/Q4_0/Q4_1 rows in place on the AVX-512 path: each group of 16 blocks is extracted into
// registers once and multiplied by up to four tokens' inputs at a time. Otherwise each thread
// unpacks a tile of rows and runs every token against them, so a prefill chunk reads each weight
// row once. From gemm_min_tokens
// tokens on, the tiles are converted to fp32 instead and go through sgemm with the fp32 input:
// a prompt's projections then have the float32 path's numbers.

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
  // With at least this many tokens (0: never), rows are converted to fp32 a tile at a time
  // (dequant.cc's values exactly) and multiplied by OpenBLAS's sgemm on the fp32 input: a prompt's
  // many tokens amortize the conversion, and sgemm's blocking outruns the integer dot products.
  // BLAS's own threads should be 1 (SetBlasThreads): the rows are already split across threads.
  // (On the demo model, 1 thread: 7 tokens in place 38.8 ms, 8 on sgemm 53.9 ms; steps of up to
  // 8 tokens read Q8_0/Q4_0/Q4_1 rows in place on the AVX-512 path.)
  int64_t gemm_min_tokens = 9;

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
