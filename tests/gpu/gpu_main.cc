// main() of the GPU test programs: without a CUDA device every test would
// skip, so the program says why and exits with 77, the code `meson test`
// (and Automake) report as a skipped test rather than a pass.
#include <gtest/gtest.h>

#include <cstdio>

#include "flashspec.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (flashspec_cuda_device_count() == 0) {
    std::printf("SKIP: no CUDA device (flashspec_cuda_device_count() == 0): the GPU tests need one\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
