// The CUDA kernel path a GPU test binary runs (tests/gpu_main/gpu_test_main.cc): ctest runs every
// GPU test twice, as `<test>` (the device's own path: Hopper's on an H100 running sm_90 code) and
// as `<test>.portable` (--cuda-kernel-path=portable: the portable sm_80 path, also on Hopper).

#ifndef LMSERVE_TESTS_GPU_MAIN_KERNEL_PATH_H_
#define LMSERVE_TESTS_GPU_MAIN_KERNEL_PATH_H_

namespace lmserve::testing {

// Whether this run forces the portable path (kernels::cuda::SetKernelPath(kPortable) is set
// before the first test).
bool PortableKernelsForced();

// The path to put in a RunnerConfig (engine::CudaKernelPath) or to set on the kernels
// (kernels::cuda::KernelPath): both enums have kAuto and kPortable. A runner sets the kernels'
// process-wide path from its configuration, so every runner a test builds must carry this one.
template <typename Path>
Path KernelPathUnderTest() {
  return PortableKernelsForced() ? Path::kPortable : Path::kAuto;
}

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_GPU_MAIN_KERNEL_PATH_H_
