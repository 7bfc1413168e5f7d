#pragma once
// ProgressBar: where fit, validate, test and predict are, on global rank 0.
//
// On a terminal it redraws one line in place — epoch, batch i/N, rate, ETA, the loss and the
// values logged with prog_bar — every refresh_rate batches, at most ten times a second (a redraw
// reads the loss and those values: one host sync). When stdout is not a terminal (a log file, CI)
// it prints plain lines instead, at most one per plain_interval. Either way each training epoch
// ends with one line: its step, train_loss, val_loss, the prog_bar values and its duration.
// Lightning adds its progress bar unless enable_progress_bar = false; so does fulgur when no
// callback is a progress bar.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/detail/loss.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

struct ProgressBarOptions {
  std::int64_t refresh_rate = 1;  ///< batches between redraws on a terminal (Lightning's refresh_rate; 0: off)
  std::chrono::duration<double> plain_interval = std::chrono::seconds(30);  ///< not a terminal: a line at most this often
  std::optional<bool> terminal{};  ///< draw in place (true) or print lines (false); unset: whether stdout is a terminal
  std::ostream* stream = nullptr;  ///< where to write; null: std::cout
};

class ProgressBar {
 public:
  static constexpr bool is_progress_bar = true;
  /// Its epoch line follows the module's on_train_epoch_end, so it shows what that logged.
  static constexpr bool monitoring = true;

  explicit ProgressBar(ProgressBarOptions options = {});

  void setup(TrainerView& trainer, Stage stage);
  void on_train_epoch_start(TrainerView& trainer);
  template <class Output, class Batch>
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module&, const Output& output, const Batch&,
                          std::int64_t batch_idx) {
    if (active_) train_batch(trainer, batch_idx, detail::loss_of(output));
  }
  void on_train_epoch_end(TrainerView& trainer);
  void on_validation_start(TrainerView& trainer) { begin_evaluation(trainer, "Validation"); }
  void on_validation_batch_end(TrainerView& trainer) { evaluation_batch(trainer); }
  void on_validation_end(TrainerView& trainer) { end_evaluation(trainer); }
  void on_test_start(TrainerView& trainer) { begin_evaluation(trainer, "Testing"); }
  void on_test_batch_end(TrainerView& trainer) { evaluation_batch(trainer); }
  void on_test_end(TrainerView& trainer) { end_evaluation(trainer); }
  void on_predict_start(TrainerView& trainer) { begin_evaluation(trainer, "Predicting"); }
  void on_predict_batch_end(TrainerView& trainer) { evaluation_batch(trainer); }
  void on_predict_end(TrainerView& trainer) { end_evaluation(trainer); }
  void on_exception(TrainerView& trainer);
  void teardown(TrainerView& trainer);

  /// Whether it draws (global rank 0, enable_progress_bar); set up by the Trainer.
  bool active() const { return active_; }
  /// A profiler times its hooks only when it draws.
  bool profiled() const { return active_; }

 private:
  using clock = std::chrono::steady_clock;

  void train_batch(TrainerView& trainer, std::int64_t batch_idx, const at::Tensor& loss);
  void begin_evaluation(TrainerView& trainer, const char* label);
  void evaluation_batch(TrainerView& trainer);
  void end_evaluation(TrainerView& trainer);
  bool due(std::int64_t done, std::int64_t total, clock::time_point now);
  std::string metrics_text(TrainerView& trainer, bool progress_bar_only) const;
  void draw(const std::string& text);
  void line(const std::string& text);
  std::ostream& out() const;

  ProgressBarOptions options_;
  bool active_ = false;
  bool terminal_ = false;
  bool drawn_ = false;  // a line is drawn in place and not ended yet
  clock::time_point epoch_start_{}, last_draw_{};
  const char* evaluation_label_ = nullptr;
  std::int64_t evaluation_done_ = 0;
  clock::time_point evaluation_start_{};
};

}  // namespace fulgur
