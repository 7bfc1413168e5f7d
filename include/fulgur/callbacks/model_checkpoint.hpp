#pragma once
// ModelCheckpoint: saves the run's checkpoints as Lightning's ModelCheckpoint does — the best
// save_top_k by a monitored metric (or the latest, without a monitor), a last.ckpt beside them,
// after training batches (every_n_train_steps), time (train_time_interval) or epochs
// (every_n_epochs, after validation or at a training epoch's end). Every rank takes the same
// decision (one collective per save check); global rank 0 writes, atomically, once the batch or
// epoch under way is over, so that each file resumes exactly (FitOptions::ckpt_path).
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/callbacks/early_stopping.hpp"  // MonitorMode
#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

struct ModelCheckpointOptions {
  std::string dirpath{};  ///< default: the first logger's log_dir + "/checkpoints", else default_root_dir/checkpoints
  /// Python-format-like template: "{epoch}-{step}" gives "epoch=3-step=120"; "{val_loss:.3f}" a metric
  /// (with auto_insert_metric_name, "val_loss=0.123"). ".ckpt" is appended.
  std::string filename = "{epoch}-{step}";
  std::string monitor{};  ///< none: the latest checkpoint is kept (save_top_k 1) or all (-1)
  MonitorMode mode = MonitorMode::min;
  std::int64_t save_top_k = 1;  ///< -1: every one; 0: none (save_last still writes last.ckpt)
  bool save_last = false;       ///< also write last.ckpt at each save (a full copy)
  bool save_weights_only = false;
  bool auto_insert_metric_name = true;
  bool verbose = false;
  std::int64_t every_n_train_steps = 0;
  std::optional<std::chrono::duration<double>> train_time_interval{};
  std::optional<std::int64_t> every_n_epochs{};  ///< default 1 when no other trigger is given
  std::optional<bool> save_on_train_epoch_end{};  ///< default: when validation runs once per epoch at its end, or never
  bool enable_version_counter = true;  ///< a name already taken gets "-v1", "-v2"...
};

class ModelCheckpoint {
 public:
  static constexpr bool monitoring = true;
  static constexpr bool state_records_files = true;  // its top k and last file: current in every checkpoint

  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  void setup(TrainerView& trainer, Stage stage);
  void on_train_start(TrainerView& trainer);
  void on_train_batch_end(TrainerView& trainer);
  void on_train_epoch_end(TrainerView& trainer);
  void on_validation_end(TrainerView& trainer);

  std::string state_key() const;
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  const ModelCheckpointOptions& options() const { return options_; }
  const std::string& dirpath() const { return dirpath_; }
  /// Where this callback keeps its checkpoints, for fit's ckpt_path = "last": the folder it used (known
  /// after a fit in this process), else its dirpath option (relative to the current directory). Its
  /// default folder under a logger is the logger's to name; default_root_dir/checkpoints the Trainer's.
  std::vector<std::string> checkpoint_folders(const std::string& default_root_dir) const;
  const std::string& best_model_path() const { return best_model_path_; }
  std::optional<double> best_model_score() const { return best_model_score_; }
  const std::string& last_model_path() const { return last_model_path_; }
  /// path -> score of the files kept (the best save_top_k).
  const std::map<std::string, double>& best_k_models() const { return best_k_models_; }
  /// The file name (without folder) the template gives for these values.
  std::string format_name(TrainerView& trainer) const;

 private:
  bool skip(const TrainerView& trainer) const;
  bool save_on_train_epoch_end(const TrainerView& trainer) const;
  bool epoch_due(const TrainerView& trainer) const;  ///< every_n_epochs says this epoch saves
  void save(TrainerView& trainer);
  void save_top_k(TrainerView& trainer);
  void save_last(TrainerView& trainer);
  std::string unique_path(TrainerView& trainer, const std::string& name, const std::string& previous) const;
  bool better(double a, double b) const;
  std::optional<double> monitored(const TrainerView& trainer) const;  ///< the monitor's value, epoch and step included

  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::map<std::string, double> best_k_models_;
  std::string best_model_path_, kth_best_model_path_, last_model_path_, latest_path_;
  std::optional<double> best_model_score_, current_score_;
  std::int64_t last_global_step_saved_ = -1;
  std::chrono::steady_clock::time_point last_time_check_{};
  bool validation_has_run_ = false;  ///< Lightning's val_loop._has_run: a monitor missing after it is an error
  bool warned_missing_monitor_ = false;
};

}  // namespace fulgur
