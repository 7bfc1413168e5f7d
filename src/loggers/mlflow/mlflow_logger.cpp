// MLFlowLogger's front: what Lightning's MLFlowLogger does to names and values before they go
// (lightning/pytorch/loggers/mlflow.py), then queued for the background Sender.
#include "fulgur/loggers/mlflow_logger.hpp"

#include <pwd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <set>

#include "checkpoint_files.hpp"
#include "files.hpp"
#include "fulgur/errors.hpp"
#include "sender.hpp"
#include "store.hpp"

namespace fulgur {
namespace mlflow = loggers::mlflow;

class MLFlowLogger::Impl {
 public:
  explicit Impl(MLFlowOptions o) : options(std::move(o)) {}

  MLFlowOptions options;
  bool writer = true;  // global rank 0
  std::string uri, dir, resumed_run;
  mlflow::CheckpointFiles checkpoints;  // before sender: its side files outlive the uploads
  std::unique_ptr<mlflow::Sender> sender;
  std::vector<std::string> warnings;  // the front's own (renamed or refused keys)
  std::set<std::string> warned;
  std::chrono::steady_clock::time_point last_scan{};

  void warn(const std::string& text) {
    std::cerr << text << std::endl;
    warnings.push_back(text);
  }
  void check_options() const;
  std::vector<mlflow::KeyValue> run_tags();
  void upload_checkpoints();
};

namespace {

std::string user_name() {
  if (const passwd* entry = ::getpwuid(::getuid()); entry != nullptr && entry->pw_name != nullptr) return entry->pw_name;
  const char* user = std::getenv("USER");
  return user != nullptr ? user : "unknown";
}

/// Lightning's re.sub("[^a-zA-Z0-9_/. -]+", "", key).
std::string lightning_metric_key(const std::string& key) {
  std::string out;
  for (const char c : key)
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
        std::string_view("_/. -").find(c) != std::string_view::npos)
      out += c;
  return out;
}

/// str(value) as Python prints it, cut to 250 characters as Lightning cuts a param's value.
std::string param_text(const HyperparameterValue& value) {
  std::string text = std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, bool>) return v ? "True" : "False";
        else if constexpr (std::is_same_v<V, std::int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<V, double>) return mlflow::python_float(v);
        else return v;
      },
      value);
  std::size_t characters = 0, at = 0;  // UTF-8: count code points, not bytes
  for (; at < text.size(); ++at)
    if ((static_cast<unsigned char>(text[at]) & 0xC0) != 0x80 && characters++ == 250) break;
  return text.substr(0, at);
}

std::string status_of(std::string_view status) {
  if (status == "failed") return "FAILED";
  if (status == "interrupted" || status == "killed") return "KILLED";
  return "FINISHED";  // "success", "finished"
}

}  // namespace

void MLFlowLogger::Impl::check_options() const {
  auto refuse = [](const std::string& text) { throw MisconfigurationError("fulgur: MLFlowLogger: " + text); };
  if (options.experiment_name.empty()) refuse("experiment_name is empty; give the experiment's name.");
  if (options.max_buffered_values == 0)
    refuse("max_buffered_values is 0; give how many unsent values to keep (the default is 100000).");
  if (options.request_timeout.count() <= 0 || options.finalize_timeout.count() < 0 || options.max_retry_interval.count() <= 0)
    refuse("request_timeout and max_retry_interval must be positive and finalize_timeout not negative (they are " +
           std::to_string(options.request_timeout.count()) + " s, " + std::to_string(options.max_retry_interval.count()) +
           " s and " + std::to_string(options.finalize_timeout.count()) + " s).");
}

std::vector<mlflow::KeyValue> MLFlowLogger::Impl::run_tags() {
  // MLflow's context tags (Lightning passes the tags through mlflow's resolve_tags), then the user's.
  std::map<std::string, std::string> tags = {
      {"mlflow.user", user_name()}, {"mlflow.source.name", mlflow::files::program_path()}, {"mlflow.source.type", "LOCAL"}};
  for (const auto& [key, value] : options.tags) tags[key] = value;
  if (options.run_name) {
    if (options.tags.contains("mlflow.runName"))
      warn("fulgur: MLFlowLogger: The tag mlflow.runName is found in tags. The value will be overridden by " +
           *options.run_name + ".");
    tags["mlflow.runName"] = *options.run_name;
  }
  std::vector<mlflow::KeyValue> out;
  for (auto& [key, value] : tags) {
    if (!mlflow::valid_key(key))
      throw MisconfigurationError("fulgur: MLFlowLogger: the tag key '" + key +
                                  "' is not one MLflow takes: at most 250 letters, digits, '_', '-', '.', ' ', ':' or "
                                  "'/', not a path such as 'a//b' or '../a'; rename it.");
    if (value.size() > 8000)
      throw MisconfigurationError("fulgur: MLFlowLogger: the tag '" + key + "' has " + std::to_string(value.size()) +
                                  " characters; MLflow takes at most 8000: shorten it.");
    out.push_back({key, value});
  }
  return out;
}

MLFlowLogger::MLFlowLogger(MLFlowOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
MLFlowLogger::~MLFlowLogger() = default;
MLFlowLogger::MLFlowLogger(MLFlowLogger&&) noexcept = default;

void MLFlowLogger::set_up(const LoggerSetup& setup) {
  Impl& self = *impl_;
  // A folder no other logger of this process names (set_up_loggers refuses two loggers of one type in
  // one folder), for the ranks that do not log and a run the server has not started yet; a
  // ModelCheckpoint takes rank 0's folder on every rank.
  static std::atomic<int> instances{0};
  const std::string placeholder = (setup.root_dir.empty() ? std::string(".") : setup.root_dir) + "/" +
                                  self.options.experiment_name + "/not-started-" + std::to_string(mlflow::now_ms()) + "-" +
                                  std::to_string(instances++);
  if (setup.global_rank != 0) {
    self.writer = false;
    self.dir = placeholder;
    return;
  }
  if (self.sender) return;  // a later stage of this process: the same run
  self.check_options();
  if (self.options.tracking_uri) {
    self.uri = *self.options.tracking_uri;
  } else if (const char* env = std::getenv("MLFLOW_TRACKING_URI"); env != nullptr && *env != '\0') {
    self.uri = env;
  } else {
    self.uri = "file:" + self.options.save_dir;
  }
  auto store = mlflow::make_store(self.uri, self.options.request_timeout);
  mlflow::RunRequest request{.experiment_name = self.options.experiment_name,
                             .artifact_location = self.options.artifact_location,
                             .run_id = self.options.run_id.value_or(self.resumed_run),
                             .run_name = {},
                             .tags = self.run_tags(),
                             .start_ms = mlflow::now_ms()};
  for (const auto& tag : request.tags)
    if (tag.key == "mlflow.runName") request.run_name = tag.value;
  if (!request.run_id.empty()) request.tags.clear();  // an existing run keeps its own
  self.sender = std::make_unique<mlflow::Sender>(
      std::move(store), std::move(request),
      mlflow::SenderSettings{self.options.max_buffered_values, self.options.max_retry_interval});
  // One attempt now, so that the run id (and the checkpoint folder named by it) is known from the
  // start; a server that does not answer is tried again in the background (Lightning would raise).
  const bool started = self.sender->start_run_now();
  const mlflow::RunInfo run = self.sender->run();
  const std::string root = self.sender->store().local() ? self.sender->store().folder()
                                                        : (setup.root_dir.empty() ? "." : setup.root_dir);
  self.dir = started ? root + "/" + run.experiment_id + "/" + run.run_id : placeholder;
}

void MLFlowLogger::resume(const std::string& version, std::int64_t) {
  if (!impl_->sender && !version.empty()) impl_->resumed_run = version;
}

void MLFlowLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  Impl& self = *impl_;
  if (!self.writer || !self.sender) return;
  const std::int64_t timestamp = mlflow::now_ms();
  std::vector<mlflow::MetricRecord> records;
  records.reserve(metrics.size());
  for (const auto& [name, value] : metrics) {
    std::string key = self.options.prefix.empty() ? name : self.options.prefix + "-" + name;
    if (std::string clean = lightning_metric_key(key); clean != key) {
      if (self.warned.insert(key).second)
        self.warn("fulgur: MLFlowLogger: MLFlow only allows '_', '/', '.' and ' ' special characters in metric name. "
                  "Replacing " + key + " with " + clean + ".");
      key = std::move(clean);
    }
    if (!mlflow::valid_key(key)) {
      if (self.warned.insert(key).second)
        self.warn("fulgur: MLFlowLogger: the metric '" + key +
                  "' is not a name MLflow takes (empty, over 250 characters, or a path such as 'a//b'); it is not logged.");
      continue;
    }
    records.push_back({std::move(key), value, timestamp, step});
  }
  self.sender->add_metrics(std::move(records));
}

void MLFlowLogger::log_hyperparams(const Hyperparameters& hparams) {
  Impl& self = *impl_;
  if (!self.writer || !self.sender) return;
  std::map<std::string, std::string> params;  // a name given twice: the last value, as a dict update
  for (const auto& [name, value] : hparams) {
    if (!mlflow::valid_key(name)) {
      if (self.warned.insert(name).second)
        self.warn("fulgur: MLFlowLogger: the hyper-parameter '" + name +
                  "' is not a name MLflow takes (letters, digits, '_', '-', '.', ' ', ':', '/'; at most 250); it is not logged.");
      continue;
    }
    params[name] = param_text(value);
  }
  std::vector<mlflow::KeyValue> list;
  for (auto& [key, value] : params) list.push_back({key, std::move(value)});
  self.sender->add_params(std::move(list));
}

void MLFlowLogger::after_save_checkpoint(const std::vector<MLFlowCheckpointFile>& kept) {
  Impl& self = *impl_;
  if (!self.writer || !self.sender || self.options.log_model == MLFlowLogModel::none) return;
  self.checkpoints.note(kept);
  if (self.options.log_model == MLFlowLogModel::all) self.upload_checkpoints();
}

void MLFlowLogger::save() {
  Impl& self = *impl_;
  // log_model="all" without after_save_checkpoint calls: the checkpoint folders are looked at
  // every few seconds (a directory listing; the uploads run in the background).
  if (!self.writer || !self.sender || self.options.log_model != MLFlowLogModel::all) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - self.last_scan < std::chrono::seconds(5)) return;
  self.last_scan = now;
  self.upload_checkpoints();
}

void MLFlowLogger::Impl::upload_checkpoints() {
  std::vector<std::string> folders = options.checkpoint_dirs;
  folders.push_back(dir + "/checkpoints");
  sender->add_artifacts(checkpoints.new_uploads(folders));
}

void MLFlowLogger::finalize(std::string_view status) {
  Impl& self = *impl_;
  if (!self.writer || !self.sender) return;
  if (self.options.log_model != MLFlowLogModel::none) self.upload_checkpoints();
  self.sender->finish(status_of(status), self.options.finalize_timeout);
}

std::vector<std::string> MLFlowLogger::take_warnings() {
  std::vector<std::string> out = std::exchange(impl_->warnings, {});
  if (impl_->sender)
    for (std::string& text : impl_->sender->take_warnings()) out.push_back(std::move(text));
  return out;
}

std::string_view MLFlowLogger::name() const { return impl_->options.experiment_name; }
std::string MLFlowLogger::version() const { return impl_->sender ? impl_->sender->run().run_id : std::string(); }
std::string MLFlowLogger::experiment_id() const {
  return impl_->sender ? impl_->sender->run().experiment_id : std::string();
}
std::string MLFlowLogger::tracking_uri() const { return impl_->uri; }
const std::string& MLFlowLogger::log_dir() const { return impl_->dir; }
std::size_t MLFlowLogger::unsent_values() const { return impl_->sender ? impl_->sender->unsent() : 0; }
std::size_t MLFlowLogger::dropped_values() const { return impl_->sender ? impl_->sender->dropped() : 0; }

}  // namespace fulgur
