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
// The most shared memory a block of the current device may opt in to (bytes; 227 KB on Hopper,
// 163 KB on the A100, 99 KB on compute capability 8.6 and 8.9); 0 when there is no device or the
// runtime fails.
int CurrentMaxSharedMemoryPerBlock();

// Whether the kernels may chain by programmatic dependent launch (on by default; used only where
// UseHopperKernels(), common.cuh). Process-wide; a runner sets it from its configuration at
// start-up.
void AllowProgrammaticLaunch(bool allowed);

// The oldest compute capability the kernels support (10 * major + minor): bf16 tensor cores,
// cp.async and ldmatrix are sm_80's.
inline constexpr int kMinComputeCapability = 80;

// Which code a kernel with a Hopper-only path runs. Decode attention streams its tiles with bulk
// copies counted off mbarriers on Hopper, with cp.async on the portable path; programmatic
// dependent launch (griddepcontrol) is Hopper's too. Every other kernel has one path (sm_80+).
enum class KernelPath : uint8_t {
  kAuto,      // Hopper's where UseHopperKernels() holds, else portable
  kPortable,  // the portable path everywhere, also on a Hopper GPU (how it is tested there)
};
// Process-wide, as AllowProgrammaticLaunch; a runner sets it from its configuration at start-up.
void SetKernelPath(KernelPath path);
KernelPath GetKernelPath();

// The compute capability (10 * major + minor) of the code this build runs on CUDA device
// `device`: the virtual architecture its kernels were compiled from (80 where a compute_80 PTX is
// JIT-compiled for a Hopper GPU, 90 for sm_90 code); 0 when the build holds no code the device
// can run (or there is no such device). Cached per device.
int KernelCodeCapability(int device);
// Whether the current device runs the Hopper paths: GetKernelPath() is kAuto, the device is sm_90
// or newer and so is the code loaded for it (KernelCodeCapability). Cached per device.
bool UseHopperKernels();
// The compute capability (10 * major + minor) a kernel of this library runs as on the current
// device, as the kernel itself sees it (__CUDA_ARCH__ / 10, written by a one-thread launch and
// read back); 0 when the launch fails. Synchronizes the device: for tests and diagnostics only,
// never during stream capture. (KernelCodeCapability must agree with it: a test checks.)
int RunningCodeCapability();
// Whether LaunchKernel (common.cuh) asks for programmatic dependent launch: UseHopperKernels()
// and AllowProgrammaticLaunch has not turned it off.
bool ProgrammaticLaunchEnabled();

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_DEVICE_H_
