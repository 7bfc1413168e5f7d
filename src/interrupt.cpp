#include "fulgur/interrupt.hpp"

#include <atomic>
#include <csignal>

namespace fulgur {
namespace {

std::atomic<bool> interrupted{false};
std::atomic<int> depth{0};
struct sigaction previous {};

extern "C" void on_sigint(int) {
  interrupted.store(true, std::memory_order_relaxed);
  std::signal(SIGINT, SIG_DFL);  // async-signal-safe; the next Ctrl-C is not ours to soften
}

}  // namespace

bool detail::interrupt_requested() noexcept { return interrupted.load(std::memory_order_relaxed); }

InterruptHandler::InterruptHandler(bool enabled) {
  if (!enabled) return;
  installed_ = true;
  if (depth.fetch_add(1) != 0) return;
  interrupted.store(false);
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write the signal lands in carries on
  sigaction(SIGINT, &action, &previous);
}

InterruptHandler::~InterruptHandler() {
  if (!installed_ || depth.fetch_sub(1) != 1) return;
  sigaction(SIGINT, &previous, nullptr);
  interrupted.store(false);
}

}  // namespace fulgur
