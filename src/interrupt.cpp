#include "fulgur/interrupt.hpp"

#include <atomic>
#include <csignal>

namespace fulgur {
namespace {

std::atomic<bool> interrupted{false};
std::atomic<int> preempted_by{0};
std::atomic<int> interrupt_depth{0}, preemption_depth{0};
struct sigaction previous_sigint {}, previous_sigterm {}, previous_sigusr1 {};

extern "C" void on_sigint(int) {
  interrupted.store(true, std::memory_order_relaxed);
  std::signal(SIGINT, SIG_DFL);  // async-signal-safe; the next Ctrl-C is not ours to soften
}

extern "C" void on_preemption(int signal) {
  int none = 0;
  preempted_by.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

void install(int signal, void (*handler)(int), struct sigaction& previous) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write the signal lands in carries on
  sigaction(signal, &action, &previous);
}

}  // namespace

bool detail::interrupt_requested() noexcept { return interrupted.load(std::memory_order_relaxed); }
int detail::preemption_signal() noexcept { return preempted_by.load(std::memory_order_relaxed); }

InterruptHandler::InterruptHandler(bool interrupt, bool preemption) : interrupt_(interrupt), preemption_(preemption) {
  if (interrupt_ && interrupt_depth.fetch_add(1) == 0) {
    interrupted.store(false);
    install(SIGINT, on_sigint, previous_sigint);
  }
  if (preemption_ && preemption_depth.fetch_add(1) == 0) {
    preempted_by.store(0);
    install(SIGTERM, on_preemption, previous_sigterm);
    install(SIGUSR1, on_preemption, previous_sigusr1);
  }
}

InterruptHandler::~InterruptHandler() {
  if (interrupt_ && interrupt_depth.fetch_sub(1) == 1) {
    sigaction(SIGINT, &previous_sigint, nullptr);
    interrupted.store(false);
  }
  if (preemption_ && preemption_depth.fetch_sub(1) == 1) {
    sigaction(SIGTERM, &previous_sigterm, nullptr);
    sigaction(SIGUSR1, &previous_sigusr1, nullptr);
    preempted_by.store(0);
  }
}

}  // namespace fulgur
