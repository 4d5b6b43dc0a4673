// The kernels' path choice (kernels/cuda/device.h): which code the driver loaded, whether the
// Hopper paths run, and the portable path forced.

#include "kernels/cuda/device.h"

#include "gtest/gtest.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

// The attribute the path choice reads (the virtual architecture the loaded code came from) is the
// __CUDA_ARCH__ the kernels run with: 90 for an sm_90 build on Hopper, 80 for a compute_80 PTX
// build JIT-compiled there.
TEST(KernelPathGpuTest, CodeCapabilityIsWhatTheKernelsRunAs) {
  LMSERVE_REQUIRE_GPU();
  const int code = KernelCodeCapability(0);
  EXPECT_GE(code, kMinComputeCapability);
  EXPECT_EQ(code, RunningCodeCapability());
  const DeviceInfo device = ListDevices()[0];
  EXPECT_LE(code, 10 * device.compute_capability_major + device.compute_capability_minor);
  std::printf("GPU %s (compute capability %d.%d) runs this build's sm_%d code\n",
              device.name.c_str(), device.compute_capability_major, device.compute_capability_minor,
              code);
}

TEST(KernelPathGpuTest, HopperPathsOnlyWhereDeviceAndCodeAreSm90AndNotForcedPortable) {
  LMSERVE_REQUIRE_GPU();
  const KernelPath binary_path = GetKernelPath();
  const DeviceInfo device = ListDevices()[0];
  const bool hopper_here = device.compute_capability_major >= 9 && KernelCodeCapability(0) >= 90;
  SetKernelPath(KernelPath::kAuto);
  EXPECT_EQ(UseHopperKernels(), hopper_here);
  AllowProgrammaticLaunch(true);
  EXPECT_EQ(ProgrammaticLaunchEnabled(), hopper_here);
  AllowProgrammaticLaunch(false);
  EXPECT_FALSE(ProgrammaticLaunchEnabled());
  AllowProgrammaticLaunch(true);
  SetKernelPath(KernelPath::kPortable);
  EXPECT_FALSE(UseHopperKernels());
  EXPECT_FALSE(ProgrammaticLaunchEnabled());  // Hopper's too
  SetKernelPath(binary_path);
  EXPECT_EQ(UseHopperKernels(), hopper_here && !lmserve::testing::PortableKernelsForced());
}

TEST(KernelPathTest, NoDeviceMeansNoCode) {
  // Safe without a GPU: no device, no code (and no crash).
  EXPECT_EQ(KernelCodeCapability(1 << 20), 0);
}

}  // namespace
}  // namespace lmserve::kernels::cuda
