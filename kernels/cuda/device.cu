#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"

namespace lmserve::kernels::cuda {

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> devices;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back(DeviceInfo{i, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                                 static_cast<int64_t>(prop.totalGlobalMem),
                                 static_cast<int64_t>(prop.l2CacheSize)});
  }
  return devices;
}

int CurrentMultiprocessorCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

int CurrentMaxSharedMemoryPerBlock() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return bytes;
}

namespace {
std::atomic<bool> programmatic_launch_allowed{true};
std::atomic<KernelPath> kernel_path{KernelPath::kAuto};

// Compiled like every kernel of this library (the same architectures): its attributes say which
// of this build's code the driver loads for a device.
__global__ void CodeProbeKernel() {}

__global__ void CodeCapabilityKernel(int* capability) {
#ifdef __CUDA_ARCH__
  *capability = __CUDA_ARCH__ / 10;
#endif
}

struct DeviceCapabilities {
  int device_capability = 0;  // 10 * major + minor
  int code_capability = 0;    // KernelCodeCapability
};

DeviceCapabilities QueryCapabilities(int device) {
  DeviceCapabilities caps;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess) {
    caps.device_capability = 10 * major + minor;
  }
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, CodeProbeKernel) == cudaSuccess) {
    caps.code_capability = attributes.ptxVersion;  // the virtual architecture compiled from
  } else {
    cudaGetLastError();  // no image for this device (not a sticky error)
  }
  return caps;
}

// The current device's, queried once per device (lock-free after that: LaunchKernel asks at every
// launch). cudaFuncGetAttributes is no stream operation, so this is safe during stream capture.
DeviceCapabilities CurrentDeviceCapabilities() {
  constexpr int kCachedDevices = 64;
  // 0: not queried yet; else 1 << 20 | device_capability << 10 | code_capability.
  static std::atomic<uint32_t> cache[kCachedDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  if (device < 0 || device >= kCachedDevices) return QueryCapabilities(device);
  uint32_t packed = cache[device].load(std::memory_order_acquire);
  if (packed == 0) {
    const DeviceCapabilities caps = QueryCapabilities(device);
    packed = 1u << 20 | static_cast<uint32_t>(caps.device_capability & 1023) << 10 |
             static_cast<uint32_t>(caps.code_capability & 1023);
    cache[device].store(packed, std::memory_order_release);
  }
  return {static_cast<int>(packed >> 10 & 1023), static_cast<int>(packed & 1023)};
}
}  // namespace

void AllowProgrammaticLaunch(bool allowed) { programmatic_launch_allowed.store(allowed); }

void SetKernelPath(KernelPath path) { kernel_path.store(path); }
KernelPath GetKernelPath() { return kernel_path.load(std::memory_order_relaxed); }

int KernelCodeCapability(int device) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device == current) return CurrentDeviceCapabilities().code_capability;
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int capability = CurrentDeviceCapabilities().code_capability;
  cudaSetDevice(current);
  return capability;
}

int RunningCodeCapability() {
  int* device_value = nullptr;
  if (cudaMalloc(&device_value, sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int capability = 0;
  CodeCapabilityKernel<<<1, 1>>>(device_value);
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpy(&capability, device_value, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    capability = 0;
  }
  cudaFree(device_value);
  return capability;
}

bool UseHopperKernels() {
  if (GetKernelPath() == KernelPath::kPortable) return false;
  const DeviceCapabilities caps = CurrentDeviceCapabilities();
  return caps.device_capability >= 90 && caps.code_capability >= 90;
}

// Hopper's (griddepcontrol is compiled only for sm_90 and newer), so the current device decides
// at each launch, as UseHopperKernels does.
bool ProgrammaticLaunchEnabled() {
  return programmatic_launch_allowed.load(std::memory_order_relaxed) && UseHopperKernels();
}

cudaError_t SetMaxDynamicSharedMemory(const void* kernel, int bytes) {
  static std::mutex mu;
  // The largest size set per (kernel, device): the attribute is a bound, so a launch asking for
  // less needs no call, and one asking for more raises it (never lowered: a kernel launched with
  // two sizes, as the sampler's candidate capacities on either kernel path, keeps working).
  static std::map<std::pair<const void*, int>, int> largest;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = largest.find({kernel, device});
  if (it != largest.end() && it->second >= bytes) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) largest[{kernel, device}] = bytes;
  return e;
}

}  // namespace lmserve::kernels::cuda
