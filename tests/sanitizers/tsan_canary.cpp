// The TSan job's canary (built only with FULGUR_SANITIZE=thread; scripts/check.sh tsan runs it).
// The job runs with ignore_noninstrumented_modules=1: accesses made inside the prebuilt LibTorch are
// not checked (its atomics are invisible to TSan, so every object it hands between threads looked
// like a race). This program shows what is still checked: a race in instrumented code, fulgur's or
// a user's, on a thread LibTorch owns. The test passes only if TSan reports it.
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace {
volatile int written_by_both = 0;  // no lock, no ordering: the race TSan must see (volatile: kept at -O1)
std::atomic<bool> ran{false};      // relaxed: tells main the task ran, orders nothing (for TSan too)
}

int main() {
  at::launch([] {  // runs on LibTorch's inter-op thread pool
    written_by_both = 1;
    ran.store(true, std::memory_order_relaxed);
  });
  while (!ran.load(std::memory_order_relaxed)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  written_by_both = 2;
  std::printf("canary: no race was reported (value %d)\n", written_by_both);
  return 0;
}
