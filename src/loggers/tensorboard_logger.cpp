#include "fulgur/loggers/tensorboard_logger.hpp"

#include <sys/stat.h>
#include "fulgur/detail/files.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <utility>

#include "fulgur/loggers/event_file.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur {
namespace {
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardLogger::TensorBoardLogger(LoggerOptions options, TensorBoardOptions tensorboard)
    : directory_(std::move(options)), tensorboard_(tensorboard) {}
TensorBoardLogger::TensorBoardLogger(TensorBoardLogger&&) noexcept = default;
TensorBoardLogger::~TensorBoardLogger() = default;  // the writer closes its file

void TensorBoardLogger::set_up(const LoggerSetup& setup) {
  writer_rank_ = setup.global_rank == 0;
  failed_ = false;  // a new stage tries again
  directory_.resolve(setup.root_dir);
}

void TensorBoardLogger::resume(const std::string& version, std::int64_t step) {
  if (directory_.resume(version)) purge_step_ = step;
}

loggers::detail::EventFileWriter& TensorBoardLogger::writer() {
  if (!events_) {
    events_ = std::make_unique<loggers::detail::EventFileWriter>(log_dir());
    if (purge_step_ >= 0) events_->add_session_start(std::exchange(purge_step_, -1), wall_time());
  }
  return *events_;
}

std::string TensorBoardLogger::event_file() const { return events_ ? events_->path() : std::string(); }

void TensorBoardLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  if (!writer_rank_ || failed_) return;
  const double now = wall_time();
  const std::string& prefix = directory_.options().prefix;
  const bool writing = events_ != nullptr;
  try {
    for (const auto& [name, value] : metrics)
      writer().add_scalar(prefix.empty() ? name : prefix + "-" + name, value, step, now);
  } catch (const std::exception& e) {
    if (!writing) throw;  // its first file of the stage: a folder it cannot use is the config's error, said at once
    give_up(e);
  }
}

void TensorBoardLogger::log_hyperparams(const Hyperparameters& hparams) {
  if (!writer_rank_ || failed_) return;
  loggers::detail::merge_hyperparameters(hparams_, hparams);
  std::vector<std::string> metric_tags;
  if (tensorboard_.default_hp_metric) metric_tags.emplace_back("hp_metric");
  const bool writing = events_ != nullptr;
  try {
    writer().add_hparams(hparams_, metric_tags, wall_time());
    if (tensorboard_.default_hp_metric) log_metrics({{"hp_metric", -1.0}}, 0);
    detail::make_directories(log_dir());
    loggers::detail::write_hparams_yaml(log_dir() + "/hparams.yaml", hparams_);
  } catch (const std::exception& e) {
    if (!writing) throw;  // as in log_metrics
    give_up(e);
  }
}

void TensorBoardLogger::save() {
  if (!events_ || failed_) return;
  try {
    events_->flush();
    // An open file whose folder was removed takes writes that no one will read: start a new file
    // (which fails, and says why, when the folder cannot be made again).
    struct stat on_disk {};
    if (::stat(events_->path().c_str(), &on_disk) != 0 || !S_ISREG(on_disk.st_mode)) {
      events_.reset();
      writer();
    }
  } catch (const std::exception& e) {
    give_up(e);
  }
}

void TensorBoardLogger::give_up(const std::exception& e) {
  failed_ = true;
  events_.reset();  // closes the file (a destructor that does not throw)
  const std::string why = detail::without_fulgur_prefix(e.what());
  warnings_.push_back("fulgur: TensorBoardLogger '" + std::string(name()) + "' cannot write to " + log_dir() + ": " +
                      why + " It logs nothing more in this run; training goes on, the other loggers and the "
                      "checkpoints are not affected.");
  std::cerr << warnings_.back() << std::endl;
}

void TensorBoardLogger::finalize(std::string_view) {
  try {
    if (events_ && !failed_) events_->close();
  } catch (const std::exception& e) {
    give_up(e);
  }
  events_.reset();  // a later stage (test after fit) opens a new file in the same version directory
}

}  // namespace fulgur
