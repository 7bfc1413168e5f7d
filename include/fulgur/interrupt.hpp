#pragma once
// Graceful stops for fit. While an InterruptHandler lives:
// - the first SIGINT (Ctrl-C) only raises a flag that the training loop reads after each batch
//   (Lightning's graceful shutdown); SIGINT then gets its default action back, so a second
//   Ctrl-C ends the process at once;
// - with preemption on, SIGTERM and SIGUSR1 (what SLURM, Kubernetes and torchrun's agent send
//   before they end a job) are noted too, and stay caught: SLURM sends SIGUSR1 and then SIGTERM,
//   and the checkpoint the first one asked for must not be cut short by the second.
namespace fulgur {
namespace detail {
/// Whether SIGINT arrived since the innermost InterruptHandler was installed.
bool interrupt_requested() noexcept;
/// The first preemption signal (SIGTERM or SIGUSR1) that arrived; 0: none.
int preemption_signal() noexcept;
}  // namespace detail

class InterruptHandler {
 public:
  /// interrupt = false: SIGINT keeps its action (TrainerConfig::handle_interrupt); preemption:
  /// SIGTERM and SIGUSR1 are caught (TrainerConfig::preemption.enabled). Handlers nest; the
  /// outermost installs the signal handlers and restores the previous ones when it ends.
  explicit InterruptHandler(bool interrupt, bool preemption = false);
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  bool interrupt_ = false, preemption_ = false;
};

}  // namespace fulgur
