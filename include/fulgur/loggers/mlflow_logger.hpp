#pragma once
// MLFlowLogger: Lightning's MLFlowLogger over MLflow's REST API (http:// or https:// tracking URIs)
// or MLflow's file store (file:<path>, or a plain path; the default is Lightning's file:./mlruns).
// Metrics go in batches, hyper-parameters as params (values stringified and cut to 250 characters,
// as Lightning does), tags and run_name on the run, which ends FINISHED / FAILED / KILLED with the
// stage. Checkpoints a ModelCheckpoint kept are uploaded as artifacts when `log_model` asks.
//
// It never stops training: log_metrics only queues (no network or disk on the calling thread); a
// background thread sends. A tracking server that is away is retried with capped back-off while up
// to `max_buffered_values` values wait; the outage is said once on stderr when it begins and when it
// ends, and kept as a warning for take_warnings(). Only global rank 0 logs. Torch-free; libcurl stays
// in the library (library fulgur_mlflow, CMake target fulgur::mlflow, package component `mlflow`).
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/loggers/hyperparameters.hpp"
#include "fulgur/loggers/log_directory.hpp"  // LoggerSetup

namespace fulgur {

using Metrics = std::map<std::string, double>;

/// Lightning's log_model: False, True (at the end of fit) or "all" (as they are saved).
enum class MLFlowLogModel { none, at_end, all };

struct MLFlowOptions {
  std::string experiment_name = "lightning_logs";
  std::optional<std::string> run_name{};  ///< the mlflow.runName tag (replaces one in `tags`)
  /// http(s)://host[:port][/path], file:<path> or a path; unset: $MLFLOW_TRACKING_URI, else file:<save_dir>.
  std::optional<std::string> tracking_uri{};
  std::map<std::string, std::string> tags{};
  std::string save_dir = "./mlruns";  ///< used only when no tracking URI is given
  MLFlowLogModel log_model = MLFlowLogModel::none;
  std::string prefix{};               ///< put before every metric name, with '-'
  std::string artifact_location{};    ///< for a new experiment; empty: the store's default
  std::optional<std::string> run_id{};  ///< log into this run instead of starting one
  /// More folders whose *.ckpt files log_model uploads (a ModelCheckpoint with its own dirpath);
  /// <log_dir()>/checkpoints, a ModelCheckpoint's default under this logger, is always looked at.
  std::vector<std::string> checkpoint_dirs{};
  // ---- fulgur's: a tracking server that is slow or away never stops training ----
  std::size_t max_buffered_values = 100'000;  ///< metric values kept while unsent; past it the oldest go
  std::chrono::duration<double> request_timeout{10.0};     ///< per request (connection included)
  std::chrono::duration<double> max_retry_interval{30.0};  ///< the back-off's cap (it starts at 0.25 s)
  std::chrono::duration<double> finalize_timeout{30.0};    ///< finalize's wait for what is unsent
};

/// A checkpoint file a checkpoint callback keeps (Lightning's after_save_checkpoint hands the callback).
struct MLFlowCheckpointFile {
  std::string path;
  std::optional<double> score{};
  bool best = false;
};

class MLFlowLogger {
 public:
  explicit MLFlowLogger(MLFlowOptions options = {});
  ~MLFlowLogger();
  MLFlowLogger(MLFlowLogger&&) noexcept;
  MLFlowLogger& operator=(MLFlowLogger&&) = delete;
  MLFlowLogger(const MLFlowLogger&) = delete;

  /// Resolves the tracking URI (a malformed one, or a file store that cannot be written, is a
  /// MisconfigurationError) and starts the run; a server that does not answer is retried later.
  void set_up(const LoggerSetup& setup);
  void log_metrics(const Metrics& metrics, std::int64_t step);
  void log_hyperparams(const Hyperparameters& hparams);
  /// Nothing to write (the background thread sends as values come); with log_model "all", looks
  /// for new checkpoints every few seconds.
  void save();
  /// "success" -> FINISHED, "failed" -> FAILED, "interrupted" -> KILLED, after what is unsent is
  /// sent (waiting at most finalize_timeout) and, with log_model, the checkpoints uploaded.
  void finalize(std::string_view status);
  /// Resuming from a checkpoint: log on into run `version` (unless options.run_id names one).
  void resume(const std::string& version, std::int64_t step);
  /// Lightning's after_save_checkpoint: the files a checkpoint callback keeps now, with their
  /// scores (log_model uploads them; "all" at once, otherwise at the end of fit).
  void after_save_checkpoint(const std::vector<MLFlowCheckpointFile>& kept);
  /// The same from a checkpoint callback (a ModelCheckpoint: its best_k_models() with their scores, the
  /// best, and last.ckpt); the Trainer calls it before the loggers' finalize.
  template <class Checkpoint>
    requires requires(const Checkpoint& c) {
      c.best_k_models();
      c.best_model_path();
      c.last_model_path();
    }
  void after_save_checkpoint(const Checkpoint& callback) {
    std::vector<MLFlowCheckpointFile> kept;
    for (const auto& [path, score] : callback.best_k_models())
      kept.push_back({path, score, path == callback.best_model_path()});
    const std::string& last = callback.last_model_path();
    if (!last.empty() && !callback.best_k_models().contains(last)) kept.push_back({last, std::nullopt, false});
    after_save_checkpoint(kept);
  }

  /// The warnings raised since the last call (a server's outage, values dropped past the buffer,
  /// renamed metric keys...): the Trainer collects them into FitResult::warnings.
  std::vector<std::string> take_warnings();

  /// The experiment's name (Lightning's `name` is the experiment id, known only once the store has
  /// answered; the name is what a resumed run is matched by).
  std::string_view name() const;
  /// The run id (Lightning's `version`); empty until the store has started the run.
  std::string version() const;
  std::string experiment_id() const;
  /// The tracking URI in use (after set_up).
  std::string tracking_uri() const;
  /// Where checkpoints of this run go by default, as Lightning lays them out:
  /// <file store>/<experiment id>/<run id>, or <default_root_dir>/<experiment id>/<run id> with a server
  /// (<default_root_dir>/<experiment name>/not-started-<time>-<n> while the server has not answered,
  /// and on the ranks that do not log).
  const std::string& log_dir() const;
  /// Values not sent yet, and dropped past max_buffered_values since the run began.
  std::size_t unsent_values() const;
  std::size_t dropped_values() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fulgur
