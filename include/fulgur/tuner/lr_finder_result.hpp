#pragma once
// What fulgur::lr_find records and concludes (Lightning's _LRFinder and _LRCallback), apart from
// the loop that drives it (tuner/lr_finder.hpp), so that the rules are compiled once in libfulgur.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fulgur {

/// How the learning rate grows from min_lr to max_lr (Lightning's mode="exponential" / "linear").
enum class LRFindMode { exponential, linear };

/// Lightning's Tuner.lr_find arguments (same names, same defaults).
struct LRFindOptions {
  double min_lr = 1e-8;
  double max_lr = 1.0;
  std::int64_t num_training = 100;  ///< optimizer steps (learning rates tried)
  LRFindMode mode = LRFindMode::exponential;
  /// Stop once the smoothed loss exceeds threshold x the best one; unset: never (Lightning's None).
  std::optional<double> early_stop_threshold = 4.0;
  /// Set the suggestion on the module's `lr` or `learning_rate` member (Lightning's lr / learning_rate
  /// attribute); fit then reads it in configure_optimizers.
  bool update_attr = false;
};

/// The recorded range test and its suggestion (Lightning's _LRFinder.results / suggestion()).
struct LRFinderResult {
  LRFindMode mode = LRFindMode::exponential;
  std::vector<double> lrs;          ///< the learning rate of each step (Lightning's results["lr"])
  std::vector<double> losses;       ///< the smoothed loss after it (results["loss"])
  std::vector<double> raw_losses;   ///< the training_step losses themselves
  bool stopped_early = false;       ///< the loss diverged before num_training steps
  /// Set by lr_find with update_attr when a suggestion exists.
  std::optional<double> applied_lr{};

  /// The learning rate at the steepest descent of the smoothed loss, the first skip_begin and the
  /// last skip_end points left out (Lightning's rules, Python's slicing included); none, with
  /// Lightning's error message on stderr, when fewer than 2 finite points remain.
  std::optional<double> suggestion(std::int64_t skip_begin = 10, std::int64_t skip_end = 1) const;
  /// Its index in lrs/losses (Lightning's _optimal_idx).
  std::optional<std::size_t> suggestion_index(std::int64_t skip_begin = 10, std::int64_t skip_end = 1) const;

  /// "lr,loss" lines (the smoothed losses), with "# mode=..., suggestion_index=..." first.
  void write_csv(const std::string& path) const;
  /// The curve as text (log-x for the exponential mode, as Lightning's plot), '*' for the suggestion.
  std::string text_plot(int width = 72, int height = 20) const;
  /// Lightning's plot(suggest=True): writes `png_path` (and its folder) with `python` running
  /// scripts/plot_lr_find.py (the copy compiled into libfulgur; `script`: another file), the CSV
  /// beside it (png_path + ".csv"); where Python or matplotlib is missing, the text plot goes to
  /// png_path + ".txt" instead. Returns the path written.
  std::string plot(const std::string& png_path, const std::string& python = "python3",
                   const std::string& script = "") const;
};

namespace lr_finder {

/// Lightning's "could not compute a suggestion" message.
inline constexpr const char* not_enough_points =
    "Failed to compute suggestion for learning rate because there are not enough points. Increase the loop"
    " iteration limits or the size of your dataset/dataloader.";

/// The learning rate of step `step` (0-based) of num_training: _ExponentialLR / _LinearLR stepped
/// once per optimizer step from min_lr (the first step keeps min_lr; step k >= 1 is at r = (k+1)/N).
double scheduled_lr(const LRFindOptions& options, std::int64_t step);

/// The options Lightning would refuse or could not use, as MisconfigurationError.
void check_options(const LRFindOptions& options);

/// _LRCallback.on_train_batch_end: smoothing (beta 0.98, Lightning's bias correction at
/// global_step + 1) and the divergence test.
class LossTracker {
 public:
  explicit LossTracker(std::optional<double> early_stop_threshold, double beta = 0.98)
      : threshold_(early_stop_threshold), beta_(beta) {}
  /// `loss` after optimizer step number `current_step` (1 for the first, as trainer.global_step).
  /// Returns the smoothed loss; stop() tells whether the search should end after this step.
  double add(double loss, std::int64_t current_step);
  bool stop() const { return stop_; }

 private:
  std::optional<double> threshold_;
  double beta_;
  double avg_loss_ = 0.0;
  double best_loss_ = 0.0;
  bool stop_ = false;
};

/// On stderr: the search ran `steps` of num_training because the data ran out after `epochs` epochs.
void warn_cut_short(const LRFindOptions& options, std::int64_t steps, std::int64_t epochs);

[[noreturn]] void raise_optimizer_count(std::size_t count);
[[noreturn]] void raise_no_lr_attribute();

}  // namespace lr_finder
}  // namespace fulgur
