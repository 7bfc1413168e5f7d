// CUDAAccelerator: the parts that need LibTorch's CUDA runtime (built with FULGUR_WITH_CUDA).
#include "fulgur/accelerators/cuda.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/Context.h>

#include <iostream>
#include <mutex>

#include "fulgur/errors.hpp"

namespace fulgur {

bool CUDAAccelerator::is_available() { return c10::cuda::device_count() > 0; }

int CUDAAccelerator::auto_device_count() { return static_cast<int>(c10::cuda::device_count()); }

void CUDAAccelerator::setup_device(const c10::Device& device) {
  if (!device.is_cuda()) throw AcceleratorError("Device should be CUDA, got " + device.str() + " instead.");
  c10::cuda::set_device(device.index());
  static std::once_flag advised;
  const auto* properties = at::cuda::getDeviceProperties(device.index());
  if (properties->major >= 8 && !at::globalContext().allowTF32CuBLAS())
    std::call_once(advised, [&] {
      std::cerr << "fulgur: " << properties->name
                << " has Tensor Cores; float32 matmuls run in full IEEE precision. To trade precision for speed, "
                   "call at::globalContext().setFloat32MatmulPrecision(\"high\") (Python: "
                   "torch.set_float32_matmul_precision('high')).\n";
    });
}

void CUDAAccelerator::teardown() {
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

bool CUDAAccelerator::supports_dtype(const c10::Device& device, c10::ScalarType dtype) {
  if (dtype != c10::kBFloat16) return true;
  return at::cuda::getDeviceProperties(device.index())->major >= 8;
}

}  // namespace fulgur
