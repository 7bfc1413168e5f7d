#pragma once
// CountingAllocator: the bytes the CPU allocator hands out and has not got back, and their peak, for
// tests and benchmarks that measure what a step keeps (tests/unit/activation_checkpoint_tests.cpp,
// bench/activation_checkpoint.cpp). Installed for a scope by CountingScope. The context of each
// pointer is the pointer itself (some kernels require it: raw_allocate), so sizes are kept aside.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace test {

struct CountingAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;
  std::int64_t live = 0, peak = 0;  // read under `mutex` while other threads may allocate
  std::mutex mutex;
  std::unordered_map<void*, std::pair<c10::DataPtr, std::int64_t>> held;

  static CountingAllocator& instance() {
    static auto* counting = new CountingAllocator();  // never destroyed: tensors it made may outlive main
    return *counting;
  }
  static void release(void* data) {
    CountingAllocator& self = instance();
    std::lock_guard<std::mutex> lock(self.mutex);
    const auto it = self.held.find(data);
    self.live -= it->second.second;
    self.held.erase(it);
  }
  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    std::lock_guard<std::mutex> lock(mutex);
    live += static_cast<std::int64_t>(n);
    peak = std::max(peak, live);
    held.emplace(data, std::make_pair(std::move(inner), static_cast<std::int64_t>(n)));
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  std::int64_t held_bytes() {
    std::lock_guard<std::mutex> lock(mutex);
    return live;
  }
};

/// The counting allocator is the CPU allocator while this lives.
struct CountingScope {
  CountingAllocator& counting;
  explicit CountingScope(CountingAllocator& c = CountingAllocator::instance()) : counting(c) {
    counting.base = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&counting, /*priority=*/0);
  }
  ~CountingScope() { c10::SetCPUAllocator(counting.base, 0); }
  CountingScope(const CountingScope&) = delete;
  CountingScope& operator=(const CountingScope&) = delete;
};

}  // namespace test
