// DeviceCopy on CUDA (include/fulgur/data/pinned_memory.hpp): pinned tensors cross on a copy stream,
// and the compute stream waits for them by an event, so a copy overlaps the kernels queued before it.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <vector>

#include "fulgur/data/pinned_memory.hpp"

namespace fulgur::data::detail {

namespace {
c10::cuda::CUDAStream device_copy_stream(c10::DeviceIndex index) {
  // One per device for the process, taken from LibTorch's pool once (any thread may copy on it).
  static const std::vector<c10::cuda::CUDAStream> streams = [] {
    std::vector<c10::cuda::CUDAStream> out;
    for (c10::DeviceIndex d = 0; d < c10::cuda::device_count(); ++d)
      out.push_back(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d));
    return out;
  }();
  return streams.at(static_cast<std::size_t>(index));
}

/// This thread's event for `device`, reused by every batch (a wait enqueued on a stream keeps the
/// state the event had when it was enqueued, so recording it again for the next batch is safe).
at::cuda::CUDAEvent& copy_done_event(c10::DeviceIndex index) {
  thread_local std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;
  if (events.size() <= static_cast<std::size_t>(index)) events.resize(static_cast<std::size_t>(index) + 1);
  auto& event = events[static_cast<std::size_t>(index)];
  if (!event) event = std::make_unique<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  return *event;
}

c10::DeviceIndex index_of(const c10::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace

c10::Stream copy_stream(c10::Device device) { return device_copy_stream(index_of(device)).unwrap(); }

at::Tensor DeviceCopy::operator()(const at::Tensor& t) {
  if (!device_.is_cuda() || !is_pinned(t)) return t.to(device_, /*non_blocking=*/true);
  const c10::DeviceIndex index = index_of(device_);
  if (!copy_stream_) {
    compute_stream_ = c10::cuda::getCurrentCUDAStream(index).unwrap();
    copy_stream_ = device_copy_stream(index).unwrap();
  }
  at::Tensor out;
  {
    // Allocated and filled on the copy stream; the host buffer stays out of the pool until it is read.
    c10::cuda::CUDAStreamGuard on_copy_stream(c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *copy_stream_));
    out = t.to(c10::Device(c10::kCUDA, index), /*non_blocking=*/true);
  }
  // Used on the compute stream: its memory is not reused before the work queued there is done.
  c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(),
                                                c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *compute_stream_));
  return out;
}

void DeviceCopy::finish() {
  if (!copy_stream_) return;
  const c10::cuda::CUDAStream copy(c10::cuda::CUDAStream::UNCHECKED, *copy_stream_);
  const c10::cuda::CUDAStream compute(c10::cuda::CUDAStream::UNCHECKED, *compute_stream_);
  at::cuda::CUDAEvent& done = copy_done_event(copy.device_index());
  done.record(copy);
  done.block(compute);
  copy_stream_.reset();
  compute_stream_.reset();
}

void DeviceCopy::finish_noexcept() noexcept {
  try {
    finish();
  } catch (...) {  // an unwinding batch: its tensors are never used, so nothing waits on them
  }
}

}  // namespace fulgur::data::detail
