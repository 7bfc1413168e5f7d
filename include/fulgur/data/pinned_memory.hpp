#pragma once
// Page-locked ("pinned") host memory for batches bound for a CUDA device, and their copy to it.
//
// DataLoader{.pin_memory = true} collates its batches straight into page-locked buffers taken from
// LibTorch's caching host allocator — a reused pool: after the first batches no cudaHostAlloc, and a
// buffer goes back to the pool only once the copy that read it has finished (the allocator records an
// event on the copy's stream). The strategies' batch_to_device then copies a pinned tensor on a copy
// stream of its own and makes the compute stream wait for that copy by an event, so the copy of batch
// n + 1 runs while the kernels of batch n still do; pageable tensors go as before (non-blocking, on
// the compute stream). Without a CUDA device, pinning is a no-op that the DataLoader says once.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <optional>

namespace fulgur::data {

/// Whether page-locked memory can be had here: LibTorch built with CUDA and a CUDA device present.
bool pinned_memory_available();
/// Whether t lives in page-locked memory of LibTorch's caching host allocator. A comparison of the
/// storage's allocator, not Tensor::is_pinned(), which asks the CUDA driver about the pointer.
bool is_pinned(const at::Tensor& t);
/// t in page-locked memory: t itself when it is there already (or undefined, or not on the CPU), else
/// a copy in a buffer from the pool. Without a CUDA device, t itself.
at::Tensor pin_memory(const at::Tensor& t);

namespace detail {
/// While one is alive on a thread, collate and TensorDataset::get_batch allocate the batch's tensors in
/// page-locked memory (so that a pinned batch costs no second copy). Nestable.
class PinnedAllocationScope {
 public:
  explicit PinnedAllocationScope(bool enable);
  ~PinnedAllocationScope();
  PinnedAllocationScope(const PinnedAllocationScope&) = delete;
  PinnedAllocationScope& operator=(const PinnedAllocationScope&) = delete;

 private:
  bool previous_;
};
/// Whether this thread is inside an enabled PinnedAllocationScope.
bool allocating_pinned();
/// at::empty in page-locked memory when allocating_pinned(), else in pageable memory.
at::Tensor empty_for_batch(at::IntArrayRef sizes, at::ScalarType dtype);

/// The copies of one batch to a CUDA device (strategies' batch_to_device): pinned tensors on the
/// device's copy stream, the others non-blocking on the current stream; finish() makes the current
/// stream wait for the copy stream's work (one event, reused). A pinned tensor's copy is recorded as
/// used on the current stream, so the caching allocator keeps its memory until the compute is done.
class DeviceCopy {
 public:
  explicit DeviceCopy(c10::Device device) : device_(device) {}
  at::Tensor operator()(const at::Tensor& t);
  void finish();
  ~DeviceCopy() {
    if (copy_stream_) finish_noexcept();
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

 private:
  void finish_noexcept() noexcept;
  c10::Device device_;
  std::optional<c10::Stream> compute_stream_, copy_stream_;  // set by the first pinned tensor
};
/// The stream DeviceCopy copies pinned tensors to `device` on (tests synchronise it on its own).
c10::Stream copy_stream(c10::Device device);
}  // namespace detail

}  // namespace fulgur::data
