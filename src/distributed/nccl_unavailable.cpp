// Built when fulgur has no CUDA support: asking for NCCL is a clear error.
#include "fulgur/errors.hpp"
#include "src/distributed/backends.hpp"

namespace fulgur::distributed::detail {
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds, c10::Device) {
  throw MisconfigurationError("fulgur was built without CUDA (FULGUR_WITH_CUDA=OFF), so it has no NCCL backend; "
                              "use DDPStrategy<backend::Gloo> or rebuild with CUDA.");
}
}  // namespace fulgur::distributed::detail
