#pragma once
// StepContext: what a training/validation step that asks for it receives as third argument —
// the loop position and `log`. Logging stores a detached tensor (no host sync); values reach the
// host once per epoch.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fulgur {

struct LogOptions {
  bool prog_bar = false;
  bool sync_dist = false;  ///< reduce (mean) across processes when read
};

class StepContext {
 public:
  std::int64_t current_epoch = 0;
  std::int64_t global_step = 0;
  std::int64_t batch_idx = 0;
  int global_rank = 0;

  /// Records a metric. In training the latest value counts; in validation the epoch's
  /// batch-size-weighted mean.
  void log(std::string_view name, const at::Tensor& value, LogOptions options = {}) {
    Entry& e = entry(name, options);
    const at::Tensor v = value.detach();
    if (accumulate_) {
      const double w = static_cast<double>(batch_size_);
      e.sum = e.sum.defined() ? e.sum + v.to(at::kDouble) * w : v.to(at::kDouble) * w;
      e.weight += w;
    } else {
      e.sum = v;
      e.weight = 1.0;
    }
  }
  void log(std::string_view name, double value, LogOptions options = {}) {
    log(name, at::scalar_tensor(value, at::kDouble), options);
  }

  struct Entry {
    std::string name;
    at::Tensor sum;
    double weight = 0.0;
    LogOptions options;
  };
  const std::vector<Entry>& entries() const { return entries_; }
  /// The entries in name order: what every rank reduces in the same order (sync_dist).
  std::vector<const Entry*> entries_by_name() const {
    std::vector<const Entry*> sorted;
    for (const auto& e : entries_) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
    return sorted;
  }
  void reset(bool accumulate) {
    entries_.clear();
    accumulate_ = accumulate;
  }
  void set_batch_size(std::int64_t n) { batch_size_ = n; }

 private:
  Entry& entry(std::string_view name, const LogOptions& options) {
    for (auto& e : entries_)
      if (e.name == name) return e;
    entries_.push_back(Entry{std::string(name), {}, 0.0, options});
    return entries_.back();
  }
  std::vector<Entry> entries_;
  bool accumulate_ = false;
  std::int64_t batch_size_ = 1;
};

}  // namespace fulgur
