#pragma once
// TensorBoardLogger: an event file TensorBoard reads (scalars, and hyper-parameters for its
// HPARAMS tab) and hparams.yaml under <save_dir>/<name>/version_<n>, as Lightning's
// TensorBoardLogger writes them, on global rank 0 only. `tensorboard --logdir <save_dir>` shows it.
// The events are encoded by fulgur itself (loggers/event_file.hpp): no TensorFlow or protobuf.
#include <cstdint>
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
namespace loggers::detail {
class EventFileWriter;
}

struct TensorBoardOptions {
  /// Log hp_metric = -1 with the hyper-parameters, so that TensorBoard's HPARAMS tab lists the run
  /// (Lightning's default_hp_metric); log your own "hp_metric" to replace it.
  bool default_hp_metric = true;
};

class TensorBoardLogger {
 public:
  explicit TensorBoardLogger(LoggerOptions options = {}, TensorBoardOptions tensorboard = {});
  ~TensorBoardLogger();
  TensorBoardLogger(TensorBoardLogger&&) noexcept;
  TensorBoardLogger& operator=(TensorBoardLogger&&) = delete;

  void set_up(const LoggerSetup& setup);
  void log_metrics(const Metrics& metrics, std::int64_t step);
  void log_hyperparams(const Hyperparameters& hparams);
  void save();
  void finalize(std::string_view status);
  /// Resuming from a checkpoint: write on in `version`; the new event file starts with TensorBoard's
  /// purge marker at `step` (the checkpoint's logging step), so what the earlier run logged from
  /// there on — after its checkpoint — is replaced by what the resumed run logs.
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
  const std::string& log_dir() const { return directory_.path(); }
  /// The event file (empty before the first write).
  std::string event_file() const;

 private:
  /// A write failed (disk full, its folder removed or replaced by a file): one warning, and no
  /// more writes this stage, so that a logger never ends a training run.
  void give_up(const std::exception& e);
  bool failed_ = false;
  std::vector<std::string> warnings_;
  loggers::detail::EventFileWriter& writer();

  loggers::detail::LogDirectory directory_;
  TensorBoardOptions tensorboard_;
  bool writer_rank_ = true;
  std::int64_t purge_step_ = -1;  // >= 0: the next event file starts with the purge marker
  std::unique_ptr<loggers::detail::EventFileWriter> events_;
  Hyperparameters hparams_;
};

}  // namespace fulgur
