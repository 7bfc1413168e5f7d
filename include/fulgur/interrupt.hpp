#pragma once
// Graceful Ctrl-C for fit (Lightning's graceful shutdown): while an InterruptHandler lives, the
// first SIGINT only raises a flag that the training loop reads after each batch; the handler then
// gives SIGINT back its default action, so a second Ctrl-C ends the process at once.
namespace fulgur {
namespace detail {
/// Whether SIGINT arrived since the innermost InterruptHandler was installed.
bool interrupt_requested() noexcept;
}  // namespace detail

class InterruptHandler {
 public:
  /// enabled = false: does nothing (TrainerConfig::handle_interrupt). Handlers nest; the outermost
  /// installs the signal handler and restores the previous one when it ends.
  explicit InterruptHandler(bool enabled);
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  bool installed_ = false;
};

}  // namespace fulgur
