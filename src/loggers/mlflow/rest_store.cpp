// MLflow's REST API (https://mlflow.org/docs/latest/rest-api.html) over libcurl: experiments/get-by-name
// and create, runs/create (or runs/get for a given run id), runs/log-batch, runs/update, and artifacts
// through the server's proxy (PUT /api/2.0/mlflow-artifacts/artifacts/..., `mlflow server` serves
// artifacts by default). Credentials as MLflow's client reads them: MLFLOW_TRACKING_TOKEN (bearer) or
// MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (basic); MLFLOW_TRACKING_INSECURE_TLS=true.
#include <curl/curl.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "files.hpp"
#include "json.hpp"
#include "store.hpp"

namespace fulgur::loggers::mlflow {
namespace {

struct Response {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string body;
  std::string error;  ///< curl's words for a transfer that failed
};

std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

std::size_t read_file_chunk(char* buffer, std::size_t size, std::size_t count, void* file) {
  return std::fread(buffer, size, count, static_cast<std::FILE*>(file));
}

int progress(void* aborted, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(aborted)->load() ? 1 : 0;
}

std::string random_key() {
  std::mt19937_64 random{std::random_device{}()};
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(random()),
                static_cast<unsigned long long>(random()));
  return text;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

/// The outcome of a request: the server's error message for a refusal, curl's for a failed transfer.
Result outcome(const Response& r, const std::string& what) {
  if (r.code != CURLE_OK) return {Outcome::retry, what + ": " + r.error, r.code == CURLE_OPERATION_TIMEDOUT};
  if (r.status >= 200 && r.status < 300) return Result::ok();
  const auto json = parse_json(r.body);
  std::string message = json ? json->string_at("message") : std::string();
  if (message.empty() && r.body.find('<') == std::string::npos) message = r.body.substr(0, 200);  // not an HTML page
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  std::string said = what + ": HTTP " + std::to_string(r.status) + (message.empty() ? "" : " " + message);
  if (r.status == 404 && !json)  // an answer that is not MLflow's: the URI's path is likely not the server's root
    said += " (not an MLflow REST answer: is the tracking URI the server's root, e.g. http://host:5000?)";
  // Throttled, a server error or a body too large for a proxy: worth trying again (413 and 504 in
  // smaller batches). Any other 4xx is this request's fault.
  if (r.status == 413 || r.status == 504) return {Outcome::retry, said, true};
  if (r.status == 429 || r.status >= 500 || r.status == 0) return {Outcome::retry, said};
  return {Outcome::rejected, said};
}

class RestStore final : public Store {
 public:
  RestStore(std::string base, std::chrono::duration<double> timeout) : base_(std::move(base)), timeout_(timeout) {
    static std::once_flag initialised;
    std::call_once(initialised, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl_ = curl_easy_init();
  }
  ~RestStore() override {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }
  RestStore(const RestStore&) = delete;
  RestStore& operator=(const RestStore&) = delete;

  std::string describe() const override { return "the MLflow server at " + base_; }
  bool local() const override { return false; }
  void set_aborted(bool aborted) override { aborted_ = aborted; }

  Result start_run(const RunRequest& request, RunInfo& out) override {
    if (!request.run_id.empty()) {
      const Response r = call("GET", "runs/get?run_id=" + escape(request.run_id), "");
      if (Result result = outcome(r, "runs/get"); result.outcome != Outcome::ok) return result;
      return read_run(r, "run.info", out);
    }
    std::string experiment;
    if (Result result = experiment_id(request, experiment); result.outcome != Outcome::ok) return result;
    // runs/create is the one request that is not idempotent: one that timed out may have created the
    // run. Each run carries a key of its own, looked for before creating again (no orphan runs).
    std::vector<KeyValue> tags = request.tags;
    tags.push_back({"fulgur.run_key", run_key_});
    if (create_uncertain_) {
      const std::string search = "{\"experiment_ids\":[" + json_string(experiment) +
                                 "],\"filter\":" + json_string("tags.`fulgur.run_key` = '" + run_key_ + "'") +
                                 ",\"max_results\":1}";
      const Response found = call("POST", "runs/search", search);
      if (Result result = outcome(found, "runs/search"); result.outcome != Outcome::ok) return result;
      const auto json = parse_json(found.body);
      const Json* runs = json ? json->find("runs") : nullptr;
      if (runs != nullptr && !runs->items.empty()) {
        out = {runs->items[0].string_at("info.experiment_id"), runs->items[0].string_at("info.run_id"),
               runs->items[0].string_at("info.artifact_uri")};
        return Result::ok();
      }
    }
    std::string body = "{\"experiment_id\":" + json_string(experiment) +
                       ",\"start_time\":" + std::to_string(request.start_ms) + ",\"tags\":" + pairs(tags);
    if (!request.run_name.empty()) body += ",\"run_name\":" + json_string(request.run_name);
    const Response r = call("POST", "runs/create", body + "}");
    create_uncertain_ = create_uncertain_ || (r.code != CURLE_OK && r.code != CURLE_COULDNT_CONNECT);
    if (Result result = outcome(r, "runs/create"); result.outcome != Outcome::ok) return result;
    return read_run(r, "run.info", out);
  }

  Result log_batch(const RunInfo& run, const std::vector<MetricRecord>& metrics, const std::vector<KeyValue>& params,
                   const std::vector<KeyValue>& tags) override {
    std::string body = "{\"run_id\":" + json_string(run.run_id) + ",\"metrics\":[";
    for (std::size_t i = 0; i < metrics.size(); ++i)
      body += std::string(i ? "," : "") + "{\"key\":" + json_string(metrics[i].key) +
              ",\"value\":" + json_number(metrics[i].value) + ",\"timestamp\":" + std::to_string(metrics[i].timestamp_ms) +
              ",\"step\":" + std::to_string(metrics[i].step) + "}";
    body += "],\"params\":" + pairs(params) + ",\"tags\":" + pairs(tags) + "}";
    return outcome(call("POST", "runs/log-batch", body), "runs/log-batch");
  }

  Result end_run(const RunInfo& run, std::string_view status, std::int64_t end_ms) override {
    const std::string body = "{\"run_id\":" + json_string(run.run_id) + ",\"status\":" + json_string(status) +
                             ",\"end_time\":" + std::to_string(end_ms) + "}";
    return outcome(call("POST", "runs/update", body), "runs/update");
  }

  Result log_artifact(const RunInfo& run, const std::string& artifact_dir, const std::string& name,
                      const std::string& local_path) override {
    const std::string prefix = "mlflow-artifacts:";
    if (run.artifact_uri.rfind("file://", 0) == 0 && files::exists(run.artifact_uri.substr(7))) {
      try {  // a server on this machine that does not proxy artifacts: its folder
        files::copy_file(local_path, files::join(files::join(run.artifact_uri.substr(7), artifact_dir), name));
        return Result::ok();
      } catch (const std::exception& e) {
        return {Outcome::retry, e.what()};
      }
    }
    if (run.artifact_uri.rfind(prefix, 0) != 0)
      return {Outcome::rejected, "the run's artifact location " + run.artifact_uri +
                                     " is not served by the tracking server; start it with --serve-artifacts (the default)"};
    std::string path = run.artifact_uri.substr(prefix.size());
    if (path.rfind("//", 0) == 0) path = path.substr(std::min(path.find('/', 2), path.size()));  // a host: ours
    std::string url = base_ + "/api/2.0/mlflow-artifacts/artifacts";
    for (const std::string& part : {path, artifact_dir, name})
      for (std::size_t start = 0; start < part.size();) {
        const std::size_t end = std::min(part.find('/', start), part.size());
        if (end > start) url += "/" + escape(part.substr(start, end - start));
        start = end + 1;
      }
    std::FILE* file = std::fopen(local_path.c_str(), "rb");
    if (file == nullptr) return {Outcome::rejected, "cannot read " + local_path};
    const Response r = perform(url, "PUT", "", file);
    std::fclose(file);
    return outcome(r, "artifact upload of " + local_path);
  }

 private:
  Result experiment_id(const RunRequest& request, std::string& id) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const Response found = call("GET", "experiments/get-by-name?experiment_name=" + escape(request.experiment_name), "");
      const auto json = parse_json(found.body);
      if (found.code == CURLE_OK && found.status == 200 && json) {
        id = json->string_at("experiment.experiment_id");
        if (json->string_at("experiment.lifecycle_stage") != "deleted") return Result::ok();
      } else if (!(found.code == CURLE_OK && found.status == 404)) {
        return outcome(found, "experiments/get-by-name");
      }
      std::string body = "{\"name\":" + json_string(request.experiment_name);
      if (!request.artifact_location.empty()) body += ",\"artifact_location\":" + json_string(request.artifact_location);
      const Response created = call("POST", "experiments/create", body + "}");
      const auto answer = parse_json(created.body);
      if (created.code == CURLE_OK && created.status == 200 && answer) {
        id = answer->string_at("experiment_id");
        return Result::ok();
      }
      // Created by another process meanwhile: look it up again.
      if (!(answer && answer->string_at("error_code") == "RESOURCE_ALREADY_EXISTS"))
        return outcome(created, "experiments/create");
    }
    return {Outcome::retry, "experiment " + request.experiment_name + " could not be looked up or created"};
  }

  static Result read_run(const Response& r, const std::string& at, RunInfo& out) {
    const auto json = parse_json(r.body);
    if (!json) return {Outcome::retry, "the server's answer is not JSON"};
    out.run_id = json->string_at(at + ".run_id");
    out.experiment_id = json->string_at(at + ".experiment_id");
    out.artifact_uri = json->string_at(at + ".artifact_uri");
    if (out.run_id.empty()) return {Outcome::retry, "the server's answer names no run"};
    return Result::ok();
  }

  static std::string pairs(const std::vector<KeyValue>& items) {
    std::string out = "[";
    for (std::size_t i = 0; i < items.size(); ++i)
      out += std::string(i ? "," : "") + "{\"key\":" + json_string(items[i].key) + ",\"value\":" +
             json_string(items[i].value) + "}";
    return out + "]";
  }

  std::string escape(const std::string& text) {
    char* escaped = curl_easy_escape(curl_, text.c_str(), static_cast<int>(text.size()));
    std::string out = escaped != nullptr ? escaped : text;
    curl_free(escaped);
    return out;
  }

  Response call(const char* method, const std::string& endpoint, const std::string& body) {
    return perform(base_ + "/api/2.0/mlflow/" + endpoint, method, body, nullptr);
  }

  Response perform(const std::string& url, const char* method, const std::string& body, std::FILE* upload) {
    Response r;
    if (curl_ == nullptr) return {CURLE_FAILED_INIT, 0, "", "libcurl could not start"};
    curl_easy_reset(curl_);
    char error[CURL_ERROR_SIZE] = {};
    const auto ms = static_cast<long>(timeout_.count() * 1000);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);  // called from a background thread
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, progress);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, &aborted_);
    if (upload != nullptr) {  // a checkpoint may take long: give up only when it stalls
      std::fseek(upload, 0, SEEK_END);
      const curl_off_t size = std::ftell(upload);
      std::fseek(upload, 0, SEEK_SET);
      curl_easy_setopt(curl_, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl_, CURLOPT_READFUNCTION, read_file_chunk);
      curl_easy_setopt(curl_, CURLOPT_READDATA, upload);
      curl_easy_setopt(curl_, CURLOPT_INFILESIZE_LARGE, size);
      curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_LIMIT, 1024L);
      curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_TIME, std::max(1L, ms / 1000));
    } else {
      curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, ms);
      if (std::string(method) == "POST") {
        curl_easy_setopt(curl_, CURLOPT_POST, 1L);
        curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.c_str());
        curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      }
    }
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    if (const std::string token = env("MLFLOW_TRACKING_TOKEN"); !token.empty()) {
      headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
    } else if (const std::string user = env("MLFLOW_TRACKING_USERNAME"); !user.empty()) {
      const std::string password = env("MLFLOW_TRACKING_PASSWORD");
      curl_easy_setopt(curl_, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(curl_, CURLOPT_USERNAME, user.c_str());
      curl_easy_setopt(curl_, CURLOPT_PASSWORD, password.c_str());
    }
    if (env("MLFLOW_TRACKING_INSECURE_TLS") == "true") curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    r.code = curl_easy_perform(curl_);
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(headers);
    r.error = error[0] != '\0' ? error : curl_easy_strerror(r.code);
    return r;
  }

  std::string base_;
  std::chrono::duration<double> timeout_;
  CURL* curl_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::string run_key_ = random_key();
  bool create_uncertain_ = false;  // a runs/create went unanswered: it may have created the run
};

}  // namespace

std::unique_ptr<Store> make_rest_store(const std::string& base_url, std::chrono::duration<double> request_timeout) {
  return std::make_unique<RestStore>(base_url, request_timeout);
}

}  // namespace fulgur::loggers::mlflow
