#pragma once
// What MLFlowLogger's background thread talks to: MLflow's REST API (rest_store.cpp, libcurl) or
// its file store (file_store.cpp). Each call is one attempt; the sender decides about retrying.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fulgur::loggers::mlflow {

struct MetricRecord {
  std::string key;
  double value = 0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
};

struct RunInfo {
  std::string experiment_id;
  std::string run_id;
  std::string artifact_uri;
};

struct RunRequest {
  std::string experiment_name;
  std::string artifact_location;
  std::string run_id;    ///< non-empty: log into this run
  std::string run_name;  ///< also in tags as mlflow.runName
  std::vector<KeyValue> tags;
  std::int64_t start_ms = 0;
};

/// ok; retry: the store is away or failing (connection, timeout, 5xx, 429, a disk error);
/// rejected: the store refused this request as it is (4xx): sending it again cannot help.
enum class Outcome { ok, retry, rejected };

struct Result {
  Outcome outcome = Outcome::ok;
  std::string message;  ///< what failed, for the warning
  bool size_may_matter = false;  ///< a retry after a timeout, 504 or 413: a smaller batch may pass
  static Result ok() { return {}; }
};

class Store {
 public:
  virtual ~Store() = default;
  /// "the MLflow server at http://..." / "the MLflow file store at /...".
  virtual std::string describe() const = 0;
  virtual bool local() const = 0;
  /// A file store's root folder (empty for a server).
  virtual std::string folder() const { return {}; }
  virtual Result start_run(const RunRequest& request, RunInfo& out) = 0;
  virtual Result log_batch(const RunInfo& run, const std::vector<MetricRecord>& metrics,
                           const std::vector<KeyValue>& params, const std::vector<KeyValue>& tags) = 0;
  /// status: "FINISHED", "FAILED" or "KILLED".
  virtual Result end_run(const RunInfo& run, std::string_view status, std::int64_t end_ms) = 0;
  /// Copies a file to <artifact_dir>/<name> among the run's artifacts.
  virtual Result log_artifact(const RunInfo& run, const std::string& artifact_dir, const std::string& name,
                              const std::string& local_path) = 0;
  /// true: requests under way give up as soon as they can (finalize's deadline has passed).
  virtual void set_aborted(bool) {}
};

/// The store for a tracking URI: http(s):// (the REST API), file:<path> or a plain path (the file
/// store, created and checked for writing here). A malformed URI or an unwritable path is a
/// MisconfigurationError naming it.
std::unique_ptr<Store> make_store(const std::string& tracking_uri, std::chrono::duration<double> request_timeout);
std::unique_ptr<Store> make_rest_store(const std::string& base_url, std::chrono::duration<double> request_timeout);
/// `uri`: the tracking URI as given, for the error message.
std::unique_ptr<Store> make_file_store(const std::string& root, const std::string& uri);

/// MLflow's rule for a metric, param or tag key (mlflow/utils/validation.py): letters, digits,
/// '_', '-', '.', ' ', ':', '/', and not a path that normalises to another name.
bool valid_key(std::string_view key);
/// A float as Python's str() prints it ("0.1", "1e-05", "3.0", "nan", "inf").
std::string python_float(double value);
std::int64_t now_ms();

}  // namespace fulgur::loggers::mlflow
