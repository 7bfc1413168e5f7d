#include "sender.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <utility>

#include "files.hpp"

namespace fulgur::loggers::mlflow {
namespace {
constexpr std::size_t max_params_per_batch = 100;    // MLflow's limits (mlflow/utils/validation.py)
constexpr std::size_t max_metrics_per_batch = 1000;
constexpr std::chrono::duration<double> first_backoff{0.25};
constexpr std::size_t max_passes_before_probe = 1024;

std::string seconds(std::chrono::duration<double> d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", d.count());
  return text;
}
}  // namespace

Sender::Sender(std::unique_ptr<Store> store, RunRequest request, SenderSettings settings)
    : store_(std::move(store)), request_(std::move(request)), settings_(settings), metric_batch_(max_metrics_per_batch) {}

Sender::~Sender() {
  {
    std::lock_guard lock(mutex_);
    abort_ = true;
    store_->set_aborted(true);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Sender::start_run_now() {
  std::unique_lock lock(mutex_);
  if (!started_ && !dead_) attempt(Step::start, lock);
  return started_;
}

void Sender::add_metrics(std::vector<MetricRecord> metrics) {
  std::lock_guard lock(mutex_);
  if (dead_) return;
  for (MetricRecord& m : metrics) {
    if (metrics_.size() >= settings_.max_buffered) {
      // Full: the oldest value not being sent goes (or this one, when all are being sent).
      ++dropped_, ++dropped_in_outage_;
      if (!failing_ && !warned_drop_) {
        warned_drop_ = true;
        say("fulgur: MLFlowLogger: " + store_->describe() + " does not keep up with the values logged; past " +
            std::to_string(settings_.max_buffered) +
            " unsent values (MLFlowOptions::max_buffered_values) the oldest are dropped.");
      }
      if (metrics_.size() <= in_flight_) continue;
      metrics_.erase(metrics_.begin() + static_cast<std::ptrdiff_t>(in_flight_));
    }
    metrics_.push_back(std::move(m));
  }
  ensure_thread();
  wake_.notify_all();
}

void Sender::add_params(std::vector<KeyValue> params) {
  std::lock_guard lock(mutex_);
  if (dead_) return;
  for (KeyValue& p : params) params_.push_back(std::move(p));
  ensure_thread();
  wake_.notify_all();
}

void Sender::add_artifacts(std::vector<ArtifactJob> jobs) {
  std::lock_guard lock(mutex_);
  if (dead_) return;
  for (ArtifactJob& job : jobs) artifacts_.push_back(std::move(job));
  ensure_thread();
  wake_.notify_all();
}

void Sender::finish(const std::string& status, std::chrono::duration<double> timeout) {
  const auto began = Clock::now();
  {
    std::unique_lock lock(mutex_);
    if (dead_) return;
    ending_ = true;
    ended_ = false;
    end_status_ = status;
    ensure_thread();
    wake_.notify_all();
    const auto deadline = began + std::chrono::duration_cast<Clock::duration>(timeout);
    if (!done_.wait_until(lock, deadline, [&] { return !running_; })) {
      abort_ = true;  // a request under way gives up too (the REST store's progress callback)
      store_->set_aborted(true);
      wake_.notify_all();
    }
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  if (!ended_) {
    std::string lost = std::to_string(metrics_.size()) + " metric values, " + std::to_string(params_.size()) +
                       " params and " + std::to_string(artifacts_.size()) + " artifacts";
    const std::string dropped = dropped_in_outage_ == 0 ? std::string()
                                : "; " + std::to_string(dropped_in_outage_) + " more were dropped before, past " +
                                      std::to_string(settings_.max_buffered) + " (MLFlowOptions::max_buffered_values)";
    say("fulgur: MLFlowLogger: finalize waited " + seconds(Clock::now() - began) + " s (MLFlowOptions::finalize_timeout) for " +
        store_->describe() + ", which did not take everything: " + lost + " were not sent and are lost" + dropped +
        (started_ ? "; the run " + run_.run_id + " is left RUNNING." : "; the run was never started."));
    dropped_in_outage_ = 0;
    metrics_.clear(), params_.clear(), artifacts_.clear();
  }
  ending_ = false;
  abort_ = false;
  store_->set_aborted(false);
}

std::vector<std::string> Sender::take_warnings() {
  std::lock_guard lock(mutex_);
  return std::exchange(warnings_, {});
}

RunInfo Sender::run() const {
  std::lock_guard lock(mutex_);
  return run_;
}
bool Sender::started() const {
  std::lock_guard lock(mutex_);
  return started_;
}
std::size_t Sender::unsent() const {
  std::lock_guard lock(mutex_);
  return unsent_locked();
}
std::size_t Sender::unsent_locked() const { return metrics_.size() + params_.size(); }
std::size_t Sender::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

void Sender::ensure_thread() {
  if (running_) return;
  if (thread_.joinable()) thread_.join();  // it has left its loop (running_ is false)
  running_ = true;
  thread_ = std::thread([this] { loop(); });
}

Sender::Step Sender::next_step() const {
  if (dead_) return Step::none;
  if (!started_) return Step::start;
  if (!params_.empty()) return Step::params;
  if (!metrics_.empty()) return Step::metrics;
  if (!artifacts_.empty()) return Step::artifact;
  if (ending_ && !ended_) return Step::end;
  return Step::none;
}

void Sender::loop() {
  std::unique_lock lock(mutex_);
  while (!abort_) {
    const Step step = next_step();
    if (step == Step::none) {
      if (ending_ || dead_) break;  // the run is ended: the thread starts again for later values
      wake_.wait(lock, [&] { return abort_ || next_step() != Step::none; });
      continue;
    }
    if (Clock::now() < retry_at_) {
      wake_.wait_until(lock, retry_at_, [&] { return abort_; });
      continue;
    }
    attempt(step, lock);
  }
  running_ = false;
  done_.notify_all();
}

void Sender::attempt(Step step, std::unique_lock<std::mutex>& lock) {
  std::vector<MetricRecord> metrics;
  std::vector<KeyValue> params;
  ArtifactJob job;
  std::size_t count = 0;
  if (step == Step::params) {
    count = std::min(params_.size(), max_params_per_batch);
    params.assign(params_.begin(), params_.begin() + static_cast<std::ptrdiff_t>(count));
  } else if (step == Step::metrics) {
    count = in_flight_ = std::min(metrics_.size(), metric_batch_);
    metrics.assign(metrics_.begin(), metrics_.begin() + static_cast<std::ptrdiff_t>(count));
  } else if (step == Step::artifact) {
    job = artifacts_.front();
  }
  const RunInfo run = run_;
  lock.unlock();  // the request runs without the lock: the training thread queues meanwhile
  RunInfo started;
  const Result result = perform(step, run, metrics, params, job, started);
  lock.lock();
  in_flight_ = 0;
  if (abort_) return;  // finalize's deadline: its own message says what is lost
  settle(step, result, count, std::move(started));
}

Result Sender::perform(Step step, const RunInfo& run, const std::vector<MetricRecord>& metrics,
                       const std::vector<KeyValue>& params, const ArtifactJob& job, RunInfo& started) {
  switch (step) {
    case Step::start: return store_->start_run(request_, started);
    case Step::params: return store_->log_batch(run, {}, params, {});
    case Step::metrics: return store_->log_batch(run, metrics, {}, {});
    case Step::artifact:
      // A checkpoint replaced since it was queued (a better one kept instead): nothing to send.
      if (!files::exists(job.local_path)) return Result::ok();
      return store_->log_artifact(run, job.dir, job.name, job.local_path);
    case Step::end: return store_->end_run(run, end_status_, now_ms());
    case Step::none: break;
  }
  return Result::ok();
}

void Sender::settle(Step step, const Result& result, std::size_t count, RunInfo started) {
  if (step == Step::metrics && !size_metric_batches(result, count)) return;
  if (result.outcome == Outcome::retry) {
    outage(result.message);
    retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(backoff_);
    backoff_ = std::min(backoff_ * 2, std::max(settings_.max_retry_interval, first_backoff));
    return;
  }
  recovered();  // the store answered, even if to refuse
  if (result.outcome == Outcome::rejected && refusals_.insert(result.message).second)
    say("fulgur: MLFlowLogger: " + store_->describe() + " refused a request (" + result.message +
        "); what it carried is dropped.");
  switch (step) {
    case Step::start:
      if (result.outcome == Outcome::ok) {
        run_ = std::move(started);
        started_ = true;
      } else {
        dead_ = true;  // nothing can be logged into a run that cannot start
        say("fulgur: MLFlowLogger: no run could be started in " + store_->describe() + "; " +
            std::to_string(unsent_locked()) + " queued values are dropped and nothing more of this run is logged.");
        metrics_.clear(), params_.clear(), artifacts_.clear();
      }
      break;
    case Step::params: params_.erase(params_.begin(), params_.begin() + static_cast<std::ptrdiff_t>(count)); break;
    case Step::metrics: metrics_.erase(metrics_.begin(), metrics_.begin() + static_cast<std::ptrdiff_t>(count)); break;
    case Step::artifact: artifacts_.pop_front(); break;
    case Step::end: ended_ = true; break;
    case Step::none: break;
  }
  if (metrics_.empty()) warned_drop_ = false;
}

bool Sender::size_metric_batches(const Result& result, std::size_t count) {
  const bool probe = std::exchange(probing_, false);
  if (result.outcome != Outcome::retry) {
    if (++passed_at_size_ >= passes_before_probe_ && metric_batch_ < max_metrics_per_batch &&
        metrics_.size() - count > metric_batch_) {  // a bigger batch is waiting: try it
      metric_batch_ = std::min(metric_batch_ * 2, max_metrics_per_batch);
      passed_at_size_ = 0;
      probing_ = true;
    }
    return true;
  }
  if (!result.size_may_matter || count <= 1) return true;
  metric_batch_ = std::max<std::size_t>(count / 2, 1);
  passed_at_size_ = 0;
  if (!probe) return true;  // an outage, or a batch too big for a slow server: said, and backed off
  passes_before_probe_ = std::min(passes_before_probe_ * 2, max_passes_before_probe);
  return false;  // the smaller size passed just before: no outage, retried at once
}

void Sender::outage(const std::string& message) {
  if (failing_) return;
  failing_ = true;
  outage_began_ = Clock::now();
  say("fulgur: MLFlowLogger: " + store_->describe() + " does not answer (" + message +
      "); training goes on: values wait (up to " + std::to_string(settings_.max_buffered) +
      ", MLFlowOptions::max_buffered_values) and are retried every " + seconds(settings_.max_retry_interval) +
      " s at most; this is said again when it answers.");
}

void Sender::recovered() {
  backoff_ = first_backoff;
  retry_at_ = {};
  if (!failing_) return;
  failing_ = false;
  const std::string text = "fulgur: MLFlowLogger: " + store_->describe() + " answers again after " +
                           seconds(Clock::now() - outage_began_) + " s; ";
  if (dropped_in_outage_ == 0)
    say(text + "nothing was lost.", /*warning=*/false);
  else
    say(text + std::to_string(dropped_in_outage_) + " metric values were dropped meanwhile, the oldest first (past " +
        std::to_string(settings_.max_buffered) + ", MLFlowOptions::max_buffered_values).");
  dropped_in_outage_ = 0;
}

void Sender::say(const std::string& text, bool warning) {
  std::cerr << text << std::endl;
  if (warning) warnings_.push_back(text);
}

}  // namespace fulgur::loggers::mlflow
