// Page-locked batches (include/fulgur/data/pinned_memory.hpp): the parts that need no CUDA headers;
// DeviceCopy's CUDA part is src/data/device_copy_cuda.cpp.
#include "fulgur/data/pinned_memory.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>

namespace fulgur::data {

namespace {
thread_local bool pinned_scope = false;

/// The caching host allocator's address: what a pinned tensor's storage names as its allocator.
const c10::Allocator* pinned_allocator() {
  static const c10::Allocator* const allocator =
      pinned_memory_available() ? at::globalContext().getPinnedMemoryAllocator(at::kCUDA) : nullptr;
  return allocator;
}
}  // namespace

bool pinned_memory_available() {
  static const bool available = at::globalContext().hasCUDA();  // a CUDA build with a device
  return available;
}

bool is_pinned(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.is_cpu()) return false;
  const c10::Allocator* allocator = pinned_allocator();
  return allocator != nullptr && t.storage().allocator() == allocator;
}

at::Tensor pin_memory(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !pinned_memory_available() || is_pinned(t)) return t;
  at::Tensor out = at::empty(t.sizes(), t.options().pinned_memory(true));
  out.copy_(t);
  return out;
}

namespace detail {

PinnedAllocationScope::PinnedAllocationScope(bool enable) : previous_(pinned_scope) {
  pinned_scope = previous_ || (enable && pinned_memory_available());
}
PinnedAllocationScope::~PinnedAllocationScope() { pinned_scope = previous_; }

bool allocating_pinned() { return pinned_scope; }

at::Tensor empty_for_batch(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(pinned_scope));
}

#if !FULGUR_WITH_CUDA
// Without CUDA nothing is pinned and no tensor goes to a CUDA device: plain copies.
at::Tensor DeviceCopy::operator()(const at::Tensor& t) { return t.to(device_, /*non_blocking=*/true); }
void DeviceCopy::finish() {}
void DeviceCopy::finish_noexcept() noexcept {}
c10::Stream copy_stream(c10::Device device) { return c10::Stream(c10::Stream::DEFAULT, device); }
#endif

}  // namespace detail
}  // namespace fulgur::data
