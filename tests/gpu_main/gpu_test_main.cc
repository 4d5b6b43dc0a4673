// main() of the GPU test binaries (kernels_gpu_test, runner_gpu_test): GoogleTest's, plus
// --cuda-kernel-path=auto|portable, the kernels' path for the whole run (kernel_path.h).

#include <cstdio>
#include <string_view>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "tests/gpu_main/kernel_path.h"

namespace lmserve::testing {
namespace {
bool portable_kernels = false;
}  // namespace

bool PortableKernelsForced() { return portable_kernels; }

}  // namespace lmserve::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes out GoogleTest's own flags
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--cuda-kernel-path=portable") {
      lmserve::testing::portable_kernels = true;
    } else if (arg == "--cuda-kernel-path=auto") {
      lmserve::testing::portable_kernels = false;
    } else {
      std::fprintf(stderr,
                   "%s: unknown argument '%s' (GoogleTest's flags and "
                   "--cuda-kernel-path=auto|portable are taken)\n",
                   argv[0], argv[i]);
      return 2;
    }
  }
  lmserve::kernels::cuda::SetKernelPath(
      lmserve::testing::KernelPathUnderTest<lmserve::kernels::cuda::KernelPath>());
  if (lmserve::testing::portable_kernels) {
    std::printf("CUDA kernels: the portable path (--cuda-kernel-path=portable)\n");
  }
  return RUN_ALL_TESTS();
}
