// GPU tests: without a CUDA device this program says so and exits 77, which ctest reports as
// "skipped" (SKIP_RETURN_CODE) — never as passed.
#include "catch_session.hpp"

#include "fulgur/accelerators/cuda.hpp"

#include <iostream>

int main(int argc, char** argv) {
  if (!fulgur::CUDAAccelerator::is_available()) {
    std::cout << "SKIPPED: no CUDA device on this machine; the CUDA tests run where one is present.\n";
    return 77;
  }
  return fulgur_tests::run_catch_session(argc, argv);
}
