#pragma once
// Where this process's loop is — the stage, epoch, batch and the hook or step last entered — in
// atomics that another thread may read at any time. The process group's heartbeat publishes it in
// the store, so that a rank whose collective timed out can say where a stuck peer is. Written by
// StepContext::enter at each hook the module or a callback defines: four relaxed stores of string
// literals and integers, no allocation, no lock. Torch-free.
#include <atomic>
#include <cstdint>
#include <string>

namespace fulgur::detail {

class LoopPosition {
 public:
  /// `stage` and `hook` must outlive the process (string literals: Stage's names, Hook::name).
  void enter(const char* stage, const char* hook, std::int64_t epoch, std::int64_t batch) noexcept {
    epoch_.store(epoch, std::memory_order_relaxed);
    batch_.store(batch, std::memory_order_relaxed);
    stage_.store(stage, std::memory_order_relaxed);
    hook_.store(hook, std::memory_order_relaxed);
  }
  /// "training_step, epoch 1, batch 3 (fit)", or "before any hook" when no loop has entered one.
  std::string describe() const {
    const char* hook = hook_.load(std::memory_order_relaxed);
    if (hook == nullptr) return "before any hook";
    const char* stage = stage_.load(std::memory_order_relaxed);
    return std::string(hook) + ", epoch " + std::to_string(epoch_.load(std::memory_order_relaxed)) + ", batch " +
           std::to_string(batch_.load(std::memory_order_relaxed)) + " (" + (stage ? stage : "?") + ")";
  }

 private:
  std::atomic<const char*> stage_{nullptr};
  std::atomic<const char*> hook_{nullptr};
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<std::int64_t> batch_{0};
};

/// This process's loop position (one per process: every Trainer's loops write it).
inline LoopPosition& loop_position() noexcept {
  static LoopPosition position;
  return position;
}

}  // namespace fulgur::detail
