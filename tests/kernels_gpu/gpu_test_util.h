// Helpers for the GPU kernel tests: skipping without a GPU, device buffers, fresh random inputs,
// 16-bit conversions, buffers in any element type (bf16, fp16, fp32), poisoning and the relative
// L2 error.

#ifndef LMSERVE_TESTS_KERNELS_GPU_GPU_TEST_UTIL_H_
#define LMSERVE_TESTS_KERNELS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/norm.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda::testing {

// Skips the test unless a CUDA GPU of compute capability 8.0 or newer is present and this build
// holds code it runs.
#define LMSERVE_REQUIRE_GPU()                                                                  \
  do {                                                                                         \
    const auto devices = ::lmserve::kernels::cuda::ListDevices();                              \
    if (devices.empty()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU kernel test skipped"; \
    if (devices[0].compute_capability_major < 8)                                               \
      GTEST_SKIP() << "GPU " << devices[0].name << " is older than sm_80: test skipped";       \
    if (::lmserve::kernels::cuda::KernelCodeCapability(0) == 0)                                \
      GTEST_SKIP() << "this build holds no code GPU " << devices[0].name << " runs: skipped";  \
  } while (0)

// Sets the kernels' process-wide path (device.h) for a scope, and restores the previous one (the
// binary's: tests/gpu_main/) on leaving it.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(KernelPath path) : saved_(GetKernelPath()) { SetKernelPath(path); }
  ~ScopedKernelPath() { SetKernelPath(saved_); }
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;

 private:
  KernelPath saved_;
};

// Sets a kernel family's process-wide switch (a `void(bool)` setter whose default is true, such
// as SetQuantSkinnyStreaming or SetF8SkinnyTensorCores) for a scope, and sets it back to true on
// leaving it, so that a test may run each case with the switch on and off.
class ScopedSwitch {
 public:
  ScopedSwitch(void (*set)(bool), bool on) : set_(set) { set_(on); }
  ~ScopedSwitch() { set_(true); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(bool);
};

#define CUDA_ASSERT(expr)                                                         \
  do {                                                                            \
    const cudaError_t err_ = (expr);                                              \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);    \
  } while (0)

// A seed for fresh inputs, printed so a failure can be replayed (LMSERVE_TEST_SEED overrides).
inline uint32_t FreshSeed() {
  static uint32_t base = [] {
    if (const char* env = std::getenv("LMSERVE_TEST_SEED")) return static_cast<uint32_t>(std::stoul(env));
    return std::random_device{}();
  }();
  static uint32_t counter = 0;
  return base + 7919u * counter++;
}

// An owned device allocation of `count` elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0 && cudaMalloc(&ptr_, count * sizeof(T)) != cudaSuccess) {
      std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", count * sizeof(T));
      std::abort();
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), count_(other.count_) {
    other.ptr_ = nullptr;
    other.count_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }
  void Upload(const std::vector<T>& host) {
    if (!host.empty()) cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    if (count_ > 0) cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Fills every byte with `byte` (0xff: NaN in bf16, fp16 and fp32).
  void Poison(int byte = 0xff) {
    if (count_ > 0) cudaMemset(ptr_, byte, count_ * sizeof(T));
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float stddev = 1.0f,
                                       float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline uint16_t ToHalfBits(float x, DType dtype) {
  return dtype == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x);
}
inline float FromHalfBits(uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

// Rounds `values` to the 16-bit type in place and returns the bits.
inline std::vector<uint16_t> RoundToHalf(std::vector<float>& values, DType dtype) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bits[i] = ToHalfBits(values[i], dtype);
    values[i] = FromHalfBits(bits[i], dtype);
  }
  return bits;
}
inline std::vector<float> HalfToFloat(const std::vector<uint16_t>& bits, DType dtype) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = FromHalfBits(bits[i], dtype);
  return v;
}

// ||out - ref|| / ||ref|| in double; infinity if any output is not finite.
inline double RelativeL2(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The CPU linear layer: y[m, n] = x[m, k] w[n, k]^T in fp32, x's rows x_stride apart (0: k).
inline std::vector<float> CpuLinear(const std::vector<float>& x, const std::vector<float>& w,
                                    int64_t m, int64_t n, int64_t k, int64_t x_stride = 0) {
  std::vector<float> y(m * n);
  kernels::LinearParams linear;
  linear.input = x.data();
  linear.weight = w.data();
  linear.output = y.data();
  linear.num_tokens = m;
  linear.in_features = k;
  linear.out_features = n;
  linear.input_stride = x_stride;
  kernels::Linear(linear);
  return y;
}

// The CPU gated activation (kernels/cpu/activation.h): out[t, i] = act(gate[t, i]) * up[t, i]
// over gate_up [tokens, 2 * intermediate] (gate rows, then up rows), in fp32.
inline std::vector<float> CpuGatedActivation(const std::vector<float>& gate_up, int64_t tokens,
                                             int64_t intermediate, GateActivation activation) {
  std::vector<float> out(tokens * intermediate);
  kernels::SiluAndMulParams act;
  act.gate_up = gate_up.data();
  act.output = out.data();
  act.num_tokens = tokens;
  act.intermediate_size = intermediate;
  act.activation = activation;
  kernels::SiluAndMul(act);
  return out;
}

inline int64_t ElementBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// A device copy of `values` in `dtype`. For bf16 and fp16 `values` is rounded in place first, so
// that the host copy (the CPU twin's input) is what the device holds; fp32 takes it as it is.
inline DeviceBuffer<uint8_t> Upload(std::vector<float>& values, DType dtype) {
  DeviceBuffer<uint8_t> buffer(values.size() * ElementBytes(dtype));
  if (dtype == DType::kF32) {
    if (!values.empty()) {
      cudaMemcpy(buffer.get(), values.data(), values.size() * 4, cudaMemcpyHostToDevice);
    }
    return buffer;
  }
  const std::vector<uint16_t> bits = RoundToHalf(values, dtype);
  if (!bits.empty()) cudaMemcpy(buffer.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  return buffer;
}
// A device buffer of `count` elements of `dtype`, every byte 0xff (NaN in each type).
inline DeviceBuffer<uint8_t> Poisoned(size_t count, DType dtype) {
  DeviceBuffer<uint8_t> buffer(count * ElementBytes(dtype));
  buffer.Poison();
  return buffer;
}
// The elements of a buffer of `dtype`, as fp32.
inline std::vector<float> Download(const DeviceBuffer<uint8_t>& buffer, DType dtype) {
  const std::vector<uint8_t> bytes = buffer.Download();
  const size_t count = bytes.size() / ElementBytes(dtype);
  std::vector<float> values(count);
  if (dtype == DType::kF32) {
    if (count > 0) std::memcpy(values.data(), bytes.data(), count * 4);
    return values;
  }
  std::vector<uint16_t> bits(count);
  if (count > 0) std::memcpy(bits.data(), bytes.data(), count * 2);
  return HalfToFloat(bits, dtype);
}

// Success if `out` equals `ref` element for element (as floats: -0 equals 0); else the number of
// differing elements and the first few of them.
inline ::testing::AssertionResult SameValues(const std::vector<float>& out,
                                             const std::vector<float>& ref) {
  if (out.size() != ref.size()) {
    return ::testing::AssertionFailure() << out.size() << " values, expected " << ref.size();
  }
  int64_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == ref[i]) continue;
    if (++mismatches <= 5) {
      char line[128];
      std::snprintf(line, sizeof(line), "\n  [%zu] %.9g, expected %.9g", i, out[i], ref[i]);
      first += line;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << out.size() << " values differ" << first;
}

// Tolerance on the relative L2 error of an element-wise kernel's output against its CPU twin over
// the same (rounded) inputs: the output's rounding for the 16-bit types; for fp32, a few ulps
// (2^-24 each, about 6e-8) of the element-wise math (expf, a division) at most.
inline double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 1e-2;
    case DType::kF16:
      return 2e-3;
    default:
      return 1e-6;
  }
}

inline const char* Name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    default:
      return "other";
  }
}

// The fused add + RMSNorm kernel on one bf16 row of `k` beside an fp32 residual (updated in
// place): the two-kernel reference of the skinny GEMMs' folded norm (skinny_gemm.h, fp8.h).
inline cudaError_t LaunchAddRmsNormRow(float* residual, const uint16_t* add, const uint16_t* weight,
                                       uint16_t* output, int64_t k, float epsilon) {
  const FusedAddRmsNormParams norm{.residual = residual,
                                   .input = add,
                                   .weight = weight,
                                   .output = output,
                                   .num_tokens = 1,
                                   .hidden_size = k,
                                   .epsilon = epsilon,
                                   .dtype = DType::kBF16,
                                   .residual_dtype = DType::kF32};
  return Launch(norm, nullptr);
}

// The two kernels a folded add + RMSNorm replaces (add_norm_residual of SkinnyGemmParams,
// F8SkinnyGemmParams or QuantSkinnyGemmParams): the norm kernel on `folded`'s addend (x, bf16)
// and weight beside `residual` (a copy of the fold's: the norm kernel adds into it), into
// `normed` ([k] bf16), then `folded`'s launch without the fold on that row, into y.
template <typename Params>
cudaError_t LaunchUnfolded(Params folded, float* residual, uint16_t* normed, void* y) {
  if (const cudaError_t e =
          LaunchAddRmsNormRow(residual, static_cast<const uint16_t*>(folded.x),
                              static_cast<const uint16_t*>(folded.add_norm_weight), normed,
                              folded.k, folded.add_norm_epsilon);
      e != cudaSuccess) {
    return e;
  }
  folded.x = normed;
  folded.y = y;
  folded.add_norm_residual = nullptr;
  folded.add_norm_weight = nullptr;
  return Launch(folded, nullptr);
}

}  // namespace lmserve::kernels::cuda::testing

#endif  // LMSERVE_TESTS_KERNELS_GPU_GPU_TEST_UTIL_H_
