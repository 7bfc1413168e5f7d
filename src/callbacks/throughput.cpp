#include "fulgur/callbacks/throughput.hpp"

#include <sstream>
#include <stdexcept>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

template <class T>
std::string text(T value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

}  // namespace

template <class T>
void Throughput::Window<T>::append(T value) {
  if (full()) {
    values[start] = value;
    start = (start + 1) % values.size();
  } else {
    values[(start + size) % values.size()] = value;
    ++size;
  }
}

template <class T>
void Throughput::append_increasing(Window<T>& window, T value) {
  if (window.size > 0 && window.back() >= value)
    throw std::invalid_argument("Throughput: Expected the value to increase, last: " + text(window.back()) +
                                ", current: " + text(value) +
                                " (times and counts given to update() are running totals: pass the sum so far)");
  window.append(value);
}

Throughput::Throughput(ThroughputOptions options) : options_(std::move(options)) {
  if (options_.world_size < 1)
    throw MisconfigurationError("Throughput: world_size must be at least 1, got " + std::to_string(options_.world_size));
  if (options_.window_size < 2)
    throw MisconfigurationError("Throughput: window_size must be at least 2 (the rates compare the window's first and "
                                "last updates), got " + std::to_string(options_.window_size));
  const auto n = static_cast<std::size_t>(options_.window_size);
  time_.values.resize(n);
  batches_.values.resize(n);
  samples_.values.resize(n);
  lengths_.values.resize(n);
  flops_.values.resize(n);
}

void Throughput::update(double time, std::int64_t batches, std::int64_t samples, std::optional<std::int64_t> lengths,
                        std::optional<std::int64_t> flops) {
  // Lightning's order of checks and appends, so that a refused update leaves what Lightning's leaves.
  append_increasing(time_, time);
  if (samples < batches)
    throw std::invalid_argument("Throughput: Expected samples (" + std::to_string(samples) +
                                ") to be greater or equal than batches (" + std::to_string(batches) + ")");
  append_increasing(batches_, batches);
  append_increasing(samples_, samples);
  if (lengths) {
    if (*lengths < samples)
      throw std::invalid_argument("Throughput: Expected lengths (" + std::to_string(*lengths) +
                                  ") to be greater or equal than samples (" + std::to_string(samples) + ")");
    append_increasing(lengths_, *lengths);
    if (samples_.size != lengths_.size)
      throw std::logic_error("Throughput: If lengths are passed (" + std::to_string(lengths_.size) +
                             "), there needs to be the same number of samples (" + std::to_string(samples_.size) +
                             "): give lengths on every update or never");
  }
  if (flops) flops_.append(*flops * options_.world_size);  // the sum over the ranks
}

Metrics Throughput::compute() const {
  Metrics metrics;
  if (time_.size == 0) return metrics;
  const std::string& sep = options_.separator;
  const auto world = static_cast<double>(options_.world_size);
  const bool global = options_.world_size > 1;
  metrics["time"] = time_.back();
  metrics["batches"] = static_cast<double>(batches_.back());
  metrics["samples"] = static_cast<double>(samples_.back());
  if (lengths_.size > 0) metrics["lengths"] = static_cast<double>(lengths_.back());
  if (time_.full()) {
    const double elapsed_time = time_.back() - time_.front();
    const double elapsed_batches = static_cast<double>(batches_.back() - batches_.front());
    const double elapsed_samples = static_cast<double>(samples_.back() - samples_.front());
    const double dev_samples_per_sec = elapsed_samples / elapsed_time;
    const double dev_batches_per_sec = elapsed_batches / elapsed_time;
    metrics["device" + sep + "batches_per_sec"] = dev_batches_per_sec;
    metrics["device" + sep + "samples_per_sec"] = dev_samples_per_sec;
    if (global) {
      metrics["batches_per_sec"] = dev_batches_per_sec * world;
      metrics["samples_per_sec"] = dev_samples_per_sec * world;
    }
    if (lengths_.full()) {
      const double dev_items_per_sec = static_cast<double>(lengths_.back() - lengths_.front()) / elapsed_time;
      metrics["device" + sep + "items_per_sec"] = dev_items_per_sec;
      if (global) metrics["items_per_sec"] = dev_items_per_sec * world;
    }
  }
  if (flops_.full()) {
    std::int64_t sum = 0;  // exact, as Python's int sum
    for (std::size_t i = 0; i < flops_.size; ++i) sum += flops_.values[(flops_.start + i) % flops_.values.size()];
    const double elapsed_flops = static_cast<double>(sum - flops_.front());
    const double flops_per_sec = elapsed_flops / (time_.back() - time_.front());
    const double dev_flops_per_sec = flops_per_sec / world;
    if (global) metrics["flops_per_sec"] = flops_per_sec;
    metrics["device" + sep + "flops_per_sec"] = dev_flops_per_sec;
    if (options_.available_flops && *options_.available_flops != 0.0)
      metrics["device" + sep + "mfu"] = dev_flops_per_sec / *options_.available_flops;
  }
  return metrics;
}

void Throughput::reset() {
  for (auto* w : {&batches_, &samples_, &lengths_, &flops_}) w->start = w->size = 0;
  time_.start = time_.size = 0;
}

std::optional<double> Throughput::last_time() const {
  if (time_.size == 0) return std::nullopt;
  return time_.back();
}

}  // namespace fulgur
