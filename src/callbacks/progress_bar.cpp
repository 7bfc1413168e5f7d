#include "fulgur/callbacks/progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

std::string fixed4(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", v);
  return text;
}

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = std::llround(seconds);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  return text;
}

std::string rate_text(double per_second) {
  char text[32];
  if (per_second >= 1.0 || per_second == 0.0)
    std::snprintf(text, sizeof text, "%.1f it/s", per_second);
  else
    std::snprintf(text, sizeof text, "%.1f s/it", 1.0 / per_second);
  return text;
}

constexpr auto min_redraw = std::chrono::milliseconds(100);

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options) : options_(options) {
  if (options_.refresh_rate < 0)
    throw MisconfigurationError("ProgressBar's refresh_rate must be >= 0 (0 turns the bar off), got " +
                                std::to_string(options_.refresh_rate) + ".");
}

std::ostream& ProgressBar::out() const { return options_.stream != nullptr ? *options_.stream : std::cout; }

void ProgressBar::setup(TrainerView& trainer, Stage) {
  active_ = trainer.config().enable_progress_bar && trainer.is_global_zero() && options_.refresh_rate > 0;
  terminal_ = options_.terminal.value_or(options_.stream == nullptr && ::isatty(STDOUT_FILENO) == 1);
  drawn_ = false;
}

void ProgressBar::on_train_epoch_start(TrainerView&) {
  epoch_start_ = last_draw_ = clock::now();
}

bool ProgressBar::due(std::int64_t done, std::int64_t total, clock::time_point now) {
  if (terminal_) {
    if (done % options_.refresh_rate != 0 && done != total) return false;
    if (now - last_draw_ < min_redraw && done != total) return false;
  } else if (now - last_draw_ < options_.plain_interval) {
    return false;
  }
  last_draw_ = now;
  return true;
}

void ProgressBar::train_batch(TrainerView& trainer, std::int64_t batch_idx, const at::Tensor& loss) {
  const std::int64_t done = batch_idx + 1;
  const std::int64_t total = trainer.num_training_batches();
  const auto now = clock::now();
  if (!due(done, total, now)) return;
  const double seconds = std::chrono::duration<double>(now - epoch_start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  std::string text = "Epoch " + std::to_string(trainer.current_epoch() + 1);
  if (trainer.max_epochs() > 0) text += "/" + std::to_string(trainer.max_epochs());
  text += "  " + std::to_string(done) + (total > 0 ? "/" + std::to_string(total) : std::string());
  if (total > 0) {
    const int percent = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
    if (terminal_) {
      constexpr int width = 20;
      const int filled = percent * width / 100;
      text += " [" + std::string(static_cast<std::size_t>(filled), '=') +
              std::string(static_cast<std::size_t>(width - filled), ' ') + "]";
    }
    text += " " + std::to_string(percent) + "%";
  }
  text += "  " + rate_text(rate);
  // The ETA counts to where this epoch's training ends: its last batch, or max_steps when that comes
  // first (a 1500-step run on a 13000-batch epoch shows minutes, not the epoch's hour).
  std::int64_t end = total;
  bool max_steps_first = false;
  if (const std::int64_t max_steps = trainer.config().max_steps; max_steps >= 0) {
    const std::int64_t left = std::max<std::int64_t>(max_steps - trainer.global_step(), 0) *
                              std::max<std::int64_t>(trainer.config().accumulate_grad_batches, 1);
    if (end < 0 || done + left < end) {
      end = done + left;
      max_steps_first = true;
    }
  }
  if (end > 0 && rate > 0)
    text += "  ETA " + duration_text(static_cast<double>(end - done) / rate) + (max_steps_first ? " (max_steps)" : "");
  if (loss.defined() && loss.numel() == 1) text += "  loss " + fixed4(loss.item<double>());
  text += metrics_text(trainer, /*progress_bar_only=*/true);
  terminal_ ? draw(text) : line(text);
}

void ProgressBar::on_train_epoch_end(TrainerView& trainer) {
  if (!active_ || trainer.sanity_checking()) return;
  std::string text = "epoch " + std::to_string(trainer.current_epoch() + 1);
  if (trainer.max_epochs() > 0) text += "/" + std::to_string(trainer.max_epochs());
  text += "  step " + std::to_string(trainer.global_step());
  text += metrics_text(trainer, /*progress_bar_only=*/false);
  text += "  (" + fixed4(std::chrono::duration<double>(clock::now() - epoch_start_).count()) + " s)";
  line(text);
}

std::string ProgressBar::metrics_text(TrainerView& trainer, bool progress_bar_only) const {
  std::string text;
  if (!progress_bar_only) {
    for (const char* name : {"train_loss", "val_loss"})
      if (const std::optional<double> value = trainer.callback_metrics().item(name))
        text += std::string("  ") + name + " " + fixed4(*value);
  }
  for (const auto& [name, value] : trainer.progress_bar_metrics().to_host_in_order())
    text += "  " + name + " " + fixed4(value);
  return text;
}

void ProgressBar::begin_evaluation(TrainerView& trainer, const char* label) {
  if (!active_ || trainer.sanity_checking()) return;
  evaluation_label_ = label;
  evaluation_done_ = 0;
  evaluation_start_ = clock::now();
}

void ProgressBar::evaluation_batch(TrainerView& trainer) {
  if (!active_ || evaluation_label_ == nullptr || !terminal_) return;  // plain output: the epoch line says it
  const std::int64_t done = ++evaluation_done_;
  const std::int64_t total = trainer.num_evaluation_batches();
  const auto now = clock::now();
  if (now - last_draw_ < min_redraw && done != total) return;
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - evaluation_start_).count();
  draw(std::string(evaluation_label_) + "  " + std::to_string(done) + (total > 0 ? "/" + std::to_string(total) : "") +
       "  " + rate_text(seconds > 0 ? static_cast<double>(done) / seconds : 0.0));
}

void ProgressBar::end_evaluation(TrainerView&) {
  evaluation_label_ = nullptr;
  if (drawn_ && terminal_) {
    out() << "\r\x1b[2K" << std::flush;  // the training line comes back at the next redraw
    drawn_ = false;
  }
}

void ProgressBar::draw(const std::string& text) {
  out() << "\r\x1b[2K" << text << std::flush;
  drawn_ = true;
}

void ProgressBar::line(const std::string& text) {
  if (drawn_) out() << "\r\x1b[2K";
  out() << text << std::endl;
  drawn_ = false;
}

void ProgressBar::on_exception(TrainerView&) {
  if (drawn_) out() << std::endl;
  drawn_ = false;
}

void ProgressBar::teardown(TrainerView&) {
  if (drawn_) out() << std::endl;
  drawn_ = false;
}

}  // namespace fulgur
