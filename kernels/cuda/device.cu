#include <cuda_runtime.h>

#include <atomic>

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

namespace {
std::atomic<bool> programmatic_launch_allowed{true};
}  // namespace

void AllowProgrammaticLaunch(bool allowed) { programmatic_launch_allowed.store(allowed); }

bool ProgrammaticLaunchEnabled() {
  if (!programmatic_launch_allowed.load(std::memory_order_relaxed)) return false;
  static const bool supported = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return supported;
}

}  // namespace lmserve::kernels::cuda
