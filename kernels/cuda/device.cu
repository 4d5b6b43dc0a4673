#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <set>
#include <tuple>

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

cudaError_t SetMaxDynamicSharedMemory(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;  // (kernel, device, bytes)
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device, bytes}) > 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.insert({kernel, device, bytes});
  return e;
}

}  // namespace lmserve::kernels::cuda
