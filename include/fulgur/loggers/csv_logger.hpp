#pragma once
// CSVLogger: metrics.csv and hparams.yaml under <save_dir>/<name>/version_<n>, as Lightning's
// CSVLogger writes them: one row per log_metrics call with its `step`, the columns sorted by name
// (the file is read back and rewritten when a new name appears), written on global rank 0 only.
// Only rows not yet saved are kept in memory, so a long run's memory does not grow with its log.
// Torch-free.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fulgur/loggers/hyperparameters.hpp"
#include "fulgur/loggers/log_directory.hpp"

namespace fulgur {

using Metrics = std::map<std::string, double>;

class CSVLogger {
 public:
  explicit CSVLogger(LoggerOptions options = {}, std::int64_t flush_logs_every_n_steps = 100);
  ~CSVLogger();
  CSVLogger(CSVLogger&&) noexcept;
  CSVLogger& operator=(CSVLogger&&) = delete;
  CSVLogger(const CSVLogger&) = delete;

  void set_up(const LoggerSetup& setup);
  void log_metrics(const Metrics& metrics, std::int64_t step);
  void log_hyperparams(const Hyperparameters& hparams);
  /// Writes what is buffered to metrics.csv.
  void save();
  void finalize(std::string_view status);
  /// Resuming from a checkpoint: write on in `version`, keeping the rows metrics.csv has before
  /// `step` (the checkpoint's logging step; later rows came after the checkpoint and are logged again).
  void resume(const std::string& version, std::int64_t step);
  /// The warning given when it could not write (once: it then logs nothing more this stage; training
  /// goes on). The Trainer collects it into FitResult::warnings.
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }
  /// Whether a write failed this stage (it logs nothing more until the next stage's set-up).
  bool failed() const { return failed_; }

  std::string_view name() const { return directory_.options().name; }
  const LoggerOptions& options() const { return directory_.options(); }
  std::string version() const { return directory_.version_name(); }
  /// Where a ModelCheckpoint without a dirpath wrote beside this logger's runs (fit's ckpt_path = "last").
  std::vector<std::string> checkpoint_folders(const std::string& default_root_dir) const {
    return directory_.checkpoint_folders(default_root_dir);
  }
  /// <save_dir>/<name>/version_<n> (known once a run has started).
  const std::string& log_dir() const { return directory_.path(); }
  std::string metrics_file() const { return log_dir() + "/metrics.csv"; }

 private:
  /// A write failed (disk full, its folder removed or replaced by a file): one warning, and no
  /// more writes this stage, so that a logger never ends a training run.
  void give_up(const std::exception& e);
  bool failed_ = false;
  std::vector<std::string> warnings_;
  void save_rows();
  void write_rows(bool rewrite);
  bool file_intact() const;  // metrics.csv is still the file this logger writes
  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  loggers::detail::LogDirectory directory_;
  std::int64_t flush_every_;
  bool writer_ = true;  // global rank 0
  std::vector<std::string> columns_;              // sorted
  std::vector<std::map<std::string, std::string>> rows_;  // the rows not saved yet
  bool started_ = false;                           // this logger wrote the file's header
  std::unique_ptr<std::FILE, CloseFile> appending_;  // metrics.csv, open from a run's first save to its end
  Hyperparameters hparams_;
  std::int64_t resume_step_ = -1;  // >= 0: the next save takes in the rows of the resumed run's file
};

}  // namespace fulgur
