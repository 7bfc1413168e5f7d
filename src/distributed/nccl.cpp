// The NCCL backend (CUDA builds): c10d's ProcessGroupNCCL on the rank's current CUDA device.
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "src/distributed/backends.hpp"

namespace fulgur::distributed::detail {
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, c10::Device device) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  backend->setBoundDeviceId(device);  // this rank's GPU, never rank % device count
  return backend;
}
}  // namespace fulgur::distributed::detail
