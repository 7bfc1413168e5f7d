#include "fulgur/loggers/tensorboard_logger.hpp"
#include "fulgur/detail/files.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "fulgur/loggers/event_file.hpp"

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
  if (!writer_rank_) return;
  const double now = wall_time();
  const std::string& prefix = directory_.options().prefix;
  for (const auto& [name, value] : metrics) writer().add_scalar(prefix.empty() ? name : prefix + "-" + name, value, step, now);
}

void TensorBoardLogger::log_hyperparams(const Hyperparameters& hparams) {
  if (!writer_rank_) return;
  loggers::detail::merge_hyperparameters(hparams_, hparams);
  std::vector<std::string> metric_tags;
  if (tensorboard_.default_hp_metric) metric_tags.emplace_back("hp_metric");
  writer().add_hparams(hparams_, metric_tags, wall_time());
  if (tensorboard_.default_hp_metric) log_metrics({{"hp_metric", -1.0}}, 0);
  detail::make_directories(log_dir());
  loggers::detail::write_hparams_yaml(log_dir() + "/hparams.yaml", hparams_);
}

void TensorBoardLogger::save() {
  if (events_) events_->flush();
}

void TensorBoardLogger::finalize(std::string_view) {
  if (events_) events_->close();
  events_.reset();  // a later stage (test after fit) opens a new file in the same version directory
}

}  // namespace fulgur
