// Gated activations (SiLU- and GELU-tanh-and-mul), the soft-cap and embedding gather.

#include <algorithm>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8_cache.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Each thread handles 8 outputs per step of a grid-stride loop; two independent loads in flight.
// The 16-bit types take the fast exponential and division (their errors far below the types'
// rounding); fp32 takes expf and the IEEE division, as the CPU twin. GELU-tanh takes tanhf for
// every type (GateActivationOf).
// kScaled (bf16): an FP8 GEMM's output scales first (SiluAndMulParams::row_scales).
template <typename T, GateActivation kActivation, bool kScaled = false>
__global__ void __launch_bounds__(kThreads)
    SiluAndMulKernel(const T* __restrict__ gate_up, T* __restrict__ output, int64_t num_vecs,
                     int64_t vecs_per_row, const float* __restrict__ row_scales,
                     const float* __restrict__ col_scales) {
  BeginDependentKernel();
  for (int64_t v = blockIdx.x * int64_t{kThreads} + threadIdx.x; v < num_vecs;
       v += int64_t{gridDim.x} * kThreads) {
    const int64_t token = v / vecs_per_row;
    const int64_t col = v - token * vecs_per_row;
    const T* gate_ptr = gate_up + (token * 2 * vecs_per_row + col) * 8;
    float g[8], u[8];
    LoadStream8<T>(gate_ptr, g);
    LoadStream8<T>(gate_ptr + vecs_per_row * 8, u);
    if constexpr (kScaled) {
      const float row_scale = row_scales[token];
      LoadAndApplyF8OutputScales(g, row_scale, col_scales + col * 8);
      LoadAndApplyF8OutputScales(u, row_scale, col_scales + (vecs_per_row + col) * 8);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      g[j] = GateActivationOf<kActivation, !std::is_same_v<T, float>>(g[j]) * u[j];
    }
    Store8<T>(output + v * 8, g);
  }
}

// The same with the output quantized per token (SiluAndMulParams::f8_output), bf16: one block a
// row. kVecs > 0: each thread keeps its up to kVecs vectors of 8 outputs in registers (bf16, as
// the plain kernel stores them) between the row's largest magnitude and their quantization; 0
// (rows wider than 8 vectors a thread): it computes them twice, the second time from L2.
// Four blocks a multiprocessor: at most 64 registers, no spills (ptxas -v). Without the bound
// the scaled 8-vector variant took 73 (3 blocks) and 36.0 us at 1,024 x 14,336 on an H100; with
// it 32.7 (446.2 against 412.8 at 16,384 rows; bench/results section 34).
template <GateActivation kActivation, bool kScaled, int kVecs>
__global__ void __launch_bounds__(kThreads, 4)
    SiluAndMulF8Kernel(const __nv_bfloat16* __restrict__ gate_up, uint8_t* __restrict__ output,
                       float* output_scales, int64_t vecs_per_row, const float* row_scales,
                       const float* __restrict__ col_scales) {
  using T = __nv_bfloat16;
  __shared__ float scratch[32];
  BeginDependentKernel();
  const int64_t token = blockIdx.x;
  // Read once, before BlockMax's barriers: output_scales may be row_scales.
  const float row_scale = kScaled ? row_scales[token] : 0.0f;
  // The scales of the gate's and the up's columns 8 col .. 8 col + 7 (kScaled), loaded before the
  // row's values (their loads in that order measured 2% faster on an H100: section 33).
  auto scales = [&](int64_t col, float (&cg)[8], float (&cu)[8]) {
    if constexpr (kScaled) {
      Load8<float>(col_scales + col * 8, cg);
      Load8<float>(col_scales + (vecs_per_row + col) * 8, cu);
    }
  };
  // Outputs 8 col .. 8 col + 7 of the row, rounded to bf16 as the plain kernel stores them.
  auto outputs = [&](int64_t col, const float (&cg)[8], const float (&cu)[8], float (&g)[8]) {
    const T* gate_ptr = gate_up + (token * 2 * vecs_per_row + col) * 8;
    float u[8];
    if constexpr (kVecs > 0) {
      LoadStream8<T>(gate_ptr, g);
      LoadStream8<T>(gate_ptr + vecs_per_row * 8, u);
    } else {  // read again by the second pass
      Load8<T>(gate_ptr, g);
      Load8<T>(gate_ptr + vecs_per_row * 8, u);
    }
    if constexpr (kScaled) {
      ApplyF8OutputScales(g, row_scale, cg);
      ApplyF8OutputScales(u, row_scale, cu);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = GateActivationOf<kActivation, true>(g[j]) * u[j];
    RoundTrip8<T>(g);
  };
  auto store = [&](int64_t col, const float (&g)[8], float multiplier) {
    *reinterpret_cast<uint2*>(output + (token * vecs_per_row + col) * 8) =
        F8x8Quantize(g, multiplier);
  };
  float amax = 0.0f;
  if constexpr (kVecs > 0) {
    uint4 held[kVecs];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = threadIdx.x + int64_t{i} * kThreads;
      if (col < vecs_per_row) {
        float cg[8], cu[8], g[8];
        scales(col, cg, cu);
        outputs(col, cg, cu, g);
        held[i] = Pack8<T>(g);
#pragma unroll
        for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(g[j]));
      }
    }
    const float multiplier = F8RowMultiplier(BlockMax(amax, scratch), output_scales + token);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = threadIdx.x + int64_t{i} * kThreads;
      if (col < vecs_per_row) {
        float g[8];
        Unpack8<T>(held[i], g);
        store(col, g, multiplier);
      }
    }
  } else {
    float cg[8], cu[8];
    for (int64_t col = threadIdx.x; col < vecs_per_row; col += kThreads) {
      float g[8];
      scales(col, cg, cu);
      outputs(col, cg, cu, g);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(g[j]));
    }
    const float multiplier = F8RowMultiplier(BlockMax(amax, scratch), output_scales + token);
    for (int64_t col = threadIdx.x; col < vecs_per_row; col += kThreads) {
      float g[8];
      scales(col, cg, cu);
      outputs(col, cg, cu, g);
      store(col, g, multiplier);
    }
  }
}

// SiluAndMulF8Kernel for a row of `vecs_per_row` vectors: the fewest registers that hold it, or
// two passes.
template <GateActivation kActivation, bool kScaled>
auto SiluAndMulF8KernelFor(int64_t vecs_per_row) {
  const int64_t per_thread = CeilDiv(vecs_per_row, int64_t{kThreads});
  if (per_thread <= 1) return SiluAndMulF8Kernel<kActivation, kScaled, 1>;
  if (per_thread <= 2) return SiluAndMulF8Kernel<kActivation, kScaled, 2>;
  if (per_thread <= 4) return SiluAndMulF8Kernel<kActivation, kScaled, 4>;
  if (per_thread <= 8) return SiluAndMulF8Kernel<kActivation, kScaled, 8>;
  return SiluAndMulF8Kernel<kActivation, kScaled, 0>;
}

// cap * tanh(x / cap), grid-stride.
__global__ void __launch_bounds__(kThreads) SoftcapKernel(float* __restrict__ data, int64_t count,
                                                          float cap) {
  BeginDependentKernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * kThreads) {
    data[i] = cap * tanhf(data[i] / cap);
  }
}

int GridLimit() {
  static const int device_sms = CurrentMultiprocessorCount();
  const int sms = device_sms > 0 ? device_sms : 132;  // an H100's, where the runtime cannot say
  return sms * 16;
}

// Copies rows in 16-byte pieces (8 elements of a 16-bit type, 4 of fp32). O, the output's type,
// is T or (beside a 16-bit T) float: the rows are widened 8 elements at a time, each times `scale`
// in fp32, unrounded.
template <typename T, typename O>
__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                    O* __restrict__ output, int64_t vocab_size, int64_t hidden_size, float scale,
                    int64_t first_id) {
  constexpr int64_t kPerPiece = 16 / sizeof(T);
  const int64_t token = blockIdx.x;
  const int64_t id = ids[token] - first_id;
  const bool valid = id >= 0 && id < vocab_size;
  const T* row = table + static_cast<int64_t>(valid ? id : 0) * hidden_size;
  O* out = output + token * hidden_size;
  if constexpr (!std::is_same_v<T, O>) {
    for (int64_t c = (blockIdx.y * int64_t{kThreads} + threadIdx.x) * kPerPiece; c < hidden_size;
         c += int64_t{gridDim.y} * kThreads * kPerPiece) {
      float x[8] = {};
      if (valid) {
        Load8<T>(row + c, x);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] *= scale;
      }
      Store8<O>(out + c, x);
    }
  } else {
    if (scale == 1.0f) {
      for (int64_t c = (blockIdx.y * int64_t{kThreads} + threadIdx.x) * kPerPiece; c < hidden_size;
           c += int64_t{gridDim.y} * kThreads * kPerPiece) {
        Store16(out + c, valid ? Load16(row + c) : make_uint4(0, 0, 0, 0));
      }
      return;
    }
    // Scaled (Gemma): each element times `scale` in fp32, rounded once.
    for (int64_t c = blockIdx.y * int64_t{kThreads} + threadIdx.x; c < hidden_size;
         c += int64_t{gridDim.y} * kThreads) {
      out[c] = FromFloat<T>(valid ? ToFloat(row[c]) * scale : 0.0f);
    }
  }
}

}  // namespace

cudaError_t Launch(const SiluAndMulParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t vecs_per_row = p.intermediate_size / 8;
    const int64_t num_vecs = p.num_tokens * vecs_per_row;
    const int64_t blocks = std::min<int64_t>(CeilDiv(num_vecs, kThreads), GridLimit());
    const bool gelu = p.activation == GateActivation::kGeluTanh;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // Validate(): an FP8 output with bf16 only
      if (p.f8_output != nullptr) {
        const bool scaled = p.row_scales != nullptr;
        auto kernel =
            gelu ? (scaled ? SiluAndMulF8KernelFor<GateActivation::kGeluTanh, true>(vecs_per_row)
                           : SiluAndMulF8KernelFor<GateActivation::kGeluTanh, false>(vecs_per_row))
                 : (scaled ? SiluAndMulF8KernelFor<GateActivation::kSilu, true>(vecs_per_row)
                           : SiluAndMulF8KernelFor<GateActivation::kSilu, false>(vecs_per_row));
        return LaunchKernel(kernel, static_cast<unsigned>(p.num_tokens), kThreads, 0, stream,
                            static_cast<const T*>(p.gate_up), static_cast<uint8_t*>(p.f8_output),
                            p.f8_output_scales, vecs_per_row, p.row_scales, p.col_scales);
      }
    }
    auto kernel = gelu ? SiluAndMulKernel<T, GateActivation::kGeluTanh>
                       : SiluAndMulKernel<T, GateActivation::kSilu>;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // Validate(): scales with bf16 only
      if (p.row_scales != nullptr) {
        kernel = gelu ? SiluAndMulKernel<T, GateActivation::kGeluTanh, true>
                      : SiluAndMulKernel<T, GateActivation::kSilu, true>;
      }
    }
    return LaunchKernel(kernel, static_cast<unsigned>(blocks), kThreads, 0, stream,
                        static_cast<const T*>(p.gate_up), static_cast<T*>(p.output), num_vecs,
                        vecs_per_row, p.row_scales, p.col_scales);
  });
}

cudaError_t Launch(const SoftcapParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(CeilDiv(p.count, kThreads), GridLimit());
  return LaunchKernel(SoftcapKernel, static_cast<unsigned>(blocks), kThreads, 0, stream, p.data,
                      p.count, p.cap);
}

cudaError_t Launch(const EmbeddingParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t per_piece = 16 / sizeof(T);
    const dim3 grid(static_cast<unsigned>(p.num_tokens),
                    static_cast<unsigned>(CeilDiv(p.hidden_size, kThreads * per_piece)));
    if constexpr (!std::is_same_v<T, float>) {
      if (p.output_dtype.value_or(p.dtype) == DType::kF32) {
        EmbeddingKernel<T, float><<<grid, kThreads, 0, stream>>>(
            static_cast<const T*>(p.table), p.ids, static_cast<float*>(p.output), p.vocab_size,
            p.hidden_size, p.scale, p.first_id);
        return cudaGetLastError();
      }
    }
    EmbeddingKernel<T, T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(p.table), p.ids,
                                                         static_cast<T*>(p.output), p.vocab_size,
                                                         p.hidden_size, p.scale, p.first_id);
    return cudaGetLastError();
  });
}

}  // namespace lmserve::kernels::cuda
