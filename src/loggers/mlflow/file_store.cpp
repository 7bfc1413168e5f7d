// MLflow's file store, written as mlflow/store/tracking/file_store.py lays it out (checked against
// the installed mlflow by tests/loggers/check_mlflow.py, which reads the runs back with MlflowClient):
//   <root>/<experiment id>/meta.yaml                      the experiment (name, artifact_location...)
//   <root>/<experiment id>/<run id>/meta.yaml             the run (status 1 RUNNING ... 5 KILLED)
//   <root>/<experiment id>/<run id>/metrics/<key>         a line "timestamp value step" per value
//   <root>/<experiment id>/<run id>/params/<key>          the value, as written
//   <root>/<experiment id>/<run id>/tags/<key>            the value, as written
//   <root>/<experiment id>/<run id>/artifacts/...         the artifacts
// A key with '/' is a sub-folder, as in MLflow.
#include <unistd.h>

#include <map>
#include <random>
#include <sstream>

#include "files.hpp"
#include "fulgur/errors.hpp"
#include "store.hpp"

namespace fulgur::loggers::mlflow {
namespace {
using files::join;

/// A YAML single-quoted scalar (PyYAML reads it back as the text).
std::string yaml_quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

/// A scalar of a meta.yaml line as PyYAML wrote it: plain, 'single' or "double" quoted.
std::string unquoted(std::string value) {
  if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
    std::string out;
    for (std::size_t i = 1; i + 1 < value.size(); ++i) {
      out += value[i];
      if (value[i] == '\'' && value[i + 1] == '\'') ++i;
    }
    return out;
  }
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
    std::string out;
    for (std::size_t i = 1; i + 1 < value.size(); ++i) {
      if (value[i] == '\\' && i + 2 < value.size()) ++i;
      out += value[i];
    }
    return out;
  }
  return value;
}

/// The top-level "key: value" lines of a meta.yaml.
std::map<std::string, std::string> read_meta(const std::string& file) {
  std::map<std::string, std::string> meta;
  std::istringstream in(files::read(file).value_or(""));
  for (std::string line; std::getline(in, line);) {
    const std::size_t colon = line.find(": ");
    if (line.empty() || line.front() == ' ' || colon == std::string::npos) continue;
    meta[line.substr(0, colon)] = unquoted(line.substr(colon + 2));
  }
  return meta;
}

std::string random_hex(std::size_t digits) {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < digits; ++i) out += hex[random() % 16];
  return out;
}

/// MLflow's experiment ids in a file store: 18 random decimal digits, the first not 0.
std::string random_experiment_id() {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  std::string id = std::to_string(1 + random() % 9);
  while (id.size() < 18) id += std::to_string(random() % 10);
  return id;
}

std::string experiment_meta(const std::string& id, const std::string& name, const std::string& location) {
  const std::string time = std::to_string(now_ms());
  return "artifact_location: " + yaml_quoted(location) + "\ncreation_time: " + time + "\nexperiment_id: " +
         yaml_quoted(id) + "\nlast_update_time: " + time + "\nlifecycle_stage: active\nname: " + yaml_quoted(name) + "\n";
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string root) : root_(std::move(root)) {}

  std::string describe() const override { return "the MLflow file store at " + root_; }
  bool local() const override { return true; }
  std::string folder() const override { return root_; }

  Result start_run(const RunRequest& request, RunInfo& out) override {
    return guarded([&] { return request.run_id.empty() ? create_run(request, out) : find_run(request.run_id, out); });
  }

  Result log_batch(const RunInfo& run, const std::vector<MetricRecord>& metrics, const std::vector<KeyValue>& params,
                   const std::vector<KeyValue>& tags) override {
    return guarded([&] {
      const std::string dir = run_dir(run);
      std::string refused;
      for (const KeyValue& param : params) {
        const std::string file = join(dir, "params/" + param.key);
        if (const auto old = files::read(file)) {  // params are immutable in MLflow: a new value is refused
          if (*old != param.value)
            refused += (refused.empty() ? "" : "; ") + std::string("param '") + param.key + "' was logged as '" + *old +
                       "', cannot change to '" + param.value + "'";
          continue;
        }
        files::write_atomically(file, param.value);
      }
      append_metrics(dir, metrics);
      for (const KeyValue& tag : tags) files::write_atomically(join(dir, "tags/" + tag.key), tag.value);
      return refused.empty() ? Result::ok() : Result{Outcome::rejected, refused};
    });
  }

  Result end_run(const RunInfo& run, std::string_view status, std::int64_t end_ms) override {
    return guarded([&] {
      const int code = status == "FINISHED" ? 3 : status == "FAILED" ? 4 : 5;  // mlflow.entities.RunStatus
      const std::string meta = join(run_dir(run), "meta.yaml");
      std::istringstream in(files::read(meta).value_or(""));
      std::string text;
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("status:", 0) == 0) line = "status: " + std::to_string(code);
        if (line.rfind("end_time:", 0) == 0) line = "end_time: " + std::to_string(end_ms);
        text += line + "\n";
      }
      files::write_atomically(meta, text);
      return Result::ok();
    });
  }

  Result log_artifact(const RunInfo& run, const std::string& artifact_dir, const std::string& name,
                      const std::string& local_path) override {
    return guarded([&] {
      if (run.artifact_uri.rfind("file://", 0) != 0)
        return Result{Outcome::rejected, "the run's artifact location " + run.artifact_uri + " is not a local folder"};
      files::copy_file(local_path, join(join(run.artifact_uri.substr(7), artifact_dir), name));
      return Result::ok();
    });
  }

 private:
  template <class F>
  Result guarded(F&& attempt) {
    try {
      return attempt();
    } catch (const std::exception& e) {  // a full disk, a folder removed: tried again later
      return {Outcome::retry, e.what()};
    }
  }

  std::string run_dir(const RunInfo& run) const { return join(join(root_, run.experiment_id), run.run_id); }

  void append_metrics(const std::string& dir, const std::vector<MetricRecord>& metrics) {
    std::map<std::string, std::string> lines;  // one open per key and batch
    for (const MetricRecord& m : metrics)
      lines[m.key] += std::to_string(m.timestamp_ms) + " " + python_float(m.value) + " " + std::to_string(m.step) + "\n";
    for (const auto& [key, text] : lines) files::append(join(dir, "metrics/" + key), text);
  }

  /// The active experiment of this name, created when there is none.
  std::string experiment_id(const RunRequest& request) {
    for (const files::Entry& entry : files::list(root_)) {
      if (!entry.directory || entry.name == ".trash") continue;
      const auto meta = read_meta(join(join(root_, entry.name), "meta.yaml"));
      const auto name = meta.find("name");
      const auto stage = meta.find("lifecycle_stage");
      if (name != meta.end() && name->second == request.experiment_name &&
          (stage == meta.end() || stage->second == "active"))
        return entry.name;
    }
    const std::string id = random_experiment_id();
    const std::string location =
        request.artifact_location.empty() ? "file://" + join(root_, id) : request.artifact_location;
    files::write_atomically(join(join(root_, id), "meta.yaml"), experiment_meta(id, request.experiment_name, location));
    return id;
  }

  Result create_run(const RunRequest& request, RunInfo& out) {
    out.experiment_id = experiment_id(request);
    out.run_id = random_hex(32);
    const std::string dir = run_dir(out);
    const auto experiment = read_meta(join(join(root_, out.experiment_id), "meta.yaml"));
    const auto location = experiment.find("artifact_location");
    out.artifact_uri = (location != experiment.end() ? location->second : "file://" + join(root_, out.experiment_id)) +
                       "/" + out.run_id + "/artifacts";
    std::string user = "unknown";
    std::vector<KeyValue> tags = request.tags;
    for (const KeyValue& tag : tags)
      if (tag.key == "mlflow.user") user = tag.value;
    // No run_name: one is made up, as MLflow makes up "<adjective>-<noun>-<n>".
    const std::string run_name = request.run_name.empty() ? "fulgur-" + random_hex(8) : request.run_name;
    if (request.run_name.empty()) tags.push_back({"mlflow.runName", run_name});
    for (const char* sub : {"metrics", "params", "artifacts", "tags"}) files::make_directories(join(dir, sub));
    files::write_atomically(join(dir, "meta.yaml"),
                            "artifact_uri: " + yaml_quoted(out.artifact_uri) +
                                "\nend_time: null\nentry_point_name: ''\nexperiment_id: " + yaml_quoted(out.experiment_id) +
                                "\nlifecycle_stage: active\nrun_id: " + yaml_quoted(out.run_id) +
                                "\nrun_name: " + yaml_quoted(run_name) +
                                "\nsource_name: ''\nsource_type: 4\nsource_version: ''\nstart_time: " +
                                std::to_string(request.start_ms) + "\nstatus: 1\ntags: []\nuser_id: " +
                                yaml_quoted(user) + "\n");
    for (const KeyValue& tag : tags) files::write_atomically(join(dir, "tags/" + tag.key), tag.value);
    return Result::ok();
  }

  Result find_run(const std::string& run_id, RunInfo& out) {
    for (const files::Entry& entry : files::list(root_)) {
      const std::string meta = join(join(join(root_, entry.name), run_id), "meta.yaml");
      if (!entry.directory || !files::exists(meta)) continue;
      out.experiment_id = entry.name;
      out.run_id = run_id;
      out.artifact_uri = read_meta(meta)["artifact_uri"];
      return Result::ok();
    }
    return {Outcome::rejected, "there is no run " + run_id + " in " + root_};
  }

  std::string root_;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& path, const std::string& uri) {
  const std::string root = files::absolute(path);
  auto refuse = [&](const std::string& why) {
    return MisconfigurationError("fulgur: MLFlowLogger: cannot use the file store '" + uri + "' (" + root +
                                 "): " + why +
                                 ". Give a folder this process can write (MLFlowOptions::tracking_uri = \"file:<folder>\" "
                                 "or save_dir), or the address of an MLflow server.");
  };
  if (path.empty()) throw refuse("not a usable path");
  const bool fresh = !files::exists(root);
  try {
    files::make_directories(root);
  } catch (const std::exception& e) {
    throw refuse(e.what());
  }
  if (::access(root.c_str(), W_OK | X_OK) != 0) throw refuse("it is not writable");
  try {
    files::make_directories(join(root, ".trash"));
    // A new store gets MLflow's Default experiment (id 0), as MLflow's FileStore creates it.
    if (fresh) files::write_atomically(join(join(root, "0"), "meta.yaml"), experiment_meta("0", "Default", "file://" + join(root, "0")));
  } catch (const std::exception& e) {
    throw refuse(e.what());
  }
  return std::make_unique<FileStore>(root);
}

}  // namespace fulgur::loggers::mlflow
