// CUDA device discovery. Safe to call on a machine without a GPU or driver: it reports none.

#ifndef LMSERVE_KERNELS_CUDA_DEVICE_H_
#define LMSERVE_KERNELS_CUDA_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lmserve::kernels::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessor_count = 0;
  int64_t total_memory_bytes = 0;
  int64_t l2_cache_bytes = 0;
};

// The visible CUDA devices; empty when there is no GPU, no driver, or the runtime fails.
std::vector<DeviceInfo> ListDevices();

// Multiprocessors of the current device; 0 when there is none or the runtime fails.
int CurrentMultiprocessorCount();

// Whether the kernels may chain by programmatic dependent launch (on by default; used only on
// sm_90+ devices, common.cuh). Process-wide; a runner sets it from its configuration at start-up.
void AllowProgrammaticLaunch(bool allowed);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_DEVICE_H_
