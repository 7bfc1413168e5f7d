#pragma once
// MLFlowLogger's background thread: what the training thread queues (metric values, params,
// artifacts) is sent to the store in MLflow's batches (100 params, 1000 metric values). A store
// that is away or failing is retried with back-off (0.25 s doubling up to a cap) while metric
// values wait, at most max_buffered values (then the oldest go, counted). An outage is said once
// when it begins and once when it ends, on stderr and as a warning; a request the store refuses
// (4xx) is dropped and said once per message. finish() sends what is queued, ends the run, and
// waits a bounded time.
//
// A metric batch that times out (or gets 413/504) may be too big for the server as it is now (a
// busy sqlite-backed server can take seconds over 1000 values, and a retried batch costs it more:
// it checks each value against those already logged). Resending the same batch would never pass,
// so the batch is halved at each such failure, down to one value; after enough batches pass at the
// smaller size, one at twice the size is tried. A probe that fails goes back quietly (the server
// answered the smaller batches: that is no outage) and the next probe waits twice as long.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store.hpp"

namespace fulgur::loggers::mlflow {

struct ArtifactJob {
  std::string dir;         ///< the folder among the run's artifacts
  std::string name;        ///< the file's name there
  std::string local_path;  ///< the file to send
};

struct SenderSettings {
  std::size_t max_buffered = 100'000;
  std::chrono::duration<double> max_retry_interval{30.0};
};

class Sender {
 public:
  Sender(std::unique_ptr<Store> store, RunRequest request, SenderSettings settings);
  ~Sender();  // gives up what is unsent at once: finalize is where waiting happens
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  /// One attempt to start the run on the calling thread (set_up); false: the thread tries again.
  bool start_run_now();
  void add_metrics(std::vector<MetricRecord> metrics);
  void add_params(std::vector<KeyValue> params);
  void add_artifacts(std::vector<ArtifactJob> jobs);
  /// Sends what is queued and ends the run with `status` (FINISHED, FAILED, KILLED), waiting at most
  /// `timeout`; what is still unsent then is dropped and said. Values added later go to the same run.
  void finish(const std::string& status, std::chrono::duration<double> timeout);

  std::vector<std::string> take_warnings();
  RunInfo run() const;
  bool started() const;
  std::size_t unsent() const;
  std::size_t dropped() const;
  const Store& store() const { return *store_; }

 private:
  enum class Step { none, start, params, metrics, artifact, end };
  using Clock = std::chrono::steady_clock;

  void loop();
  Step next_step() const;
  void attempt(Step step, std::unique_lock<std::mutex>& lock);
  Result perform(Step step, const RunInfo& run, const std::vector<MetricRecord>& metrics,
                 const std::vector<KeyValue>& params, const ArtifactJob& job, RunInfo& started);
  void settle(Step step, const Result& result, std::size_t count, RunInfo started);
  /// Halves or grows metric_batch_ after a log-batch; false: a failed probe, retried at once unsaid.
  bool size_metric_batches(const Result& result, std::size_t count);
  void ensure_thread();
  void outage(const std::string& message);
  void recovered();
  void say(const std::string& text, bool warning = true);
  std::size_t unsent_locked() const;

  std::unique_ptr<Store> store_;
  RunRequest request_;
  SenderSettings settings_;

  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::thread thread_;
  bool running_ = false, abort_ = false;
  bool started_ = false, dead_ = false;  // dead_: the store refused to start the run
  bool ending_ = false, ended_ = false;
  std::string end_status_;
  RunInfo run_;
  std::deque<MetricRecord> metrics_;
  std::deque<KeyValue> params_;
  std::deque<ArtifactJob> artifacts_;
  std::size_t in_flight_ = 0;  // metric values at the queue's front being sent now
  std::size_t dropped_ = 0, dropped_in_outage_ = 0;
  bool failing_ = false, warned_drop_ = false;
  Clock::time_point outage_began_{}, retry_at_{};
  std::chrono::duration<double> backoff_{0.25};
  std::size_t metric_batch_;                // metric values per log-batch now (MLflow's limit at most)
  std::size_t passed_at_size_ = 0;          // batches passed since metric_batch_ was last changed
  std::size_t passes_before_probe_ = 16;    // how many must pass before a batch twice as big is tried
  bool probing_ = false;                    // the batch under way is such a trial
  std::set<std::string> refusals_;  // messages said already
  std::vector<std::string> warnings_;
};

}  // namespace fulgur::loggers::mlflow
