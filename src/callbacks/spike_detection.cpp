#include "fulgur/callbacks/spike_detection.hpp"

#include <cctype>
#include <cmath>
#include <iterator>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

std::string loss_text(double v) {
  if (std::isnan(v)) return "nan";  // not printf's "-nan" for 0 / 0
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

/// Python's json.dump(values, f, indent=4), byte for byte.
std::string json_list(const std::vector<std::int64_t>& values) {
  if (values.empty()) return "[]";
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i == 0 ? "\n    " : ",\n    ") + std::to_string(values[i]);
  return text + "\n]";
}

// Fabric compares |loss - running mean| with atol and rtol as torch does: in the loss's dtype
// promoted with float32 (the running mean's), so in double only for a double loss; rtol * mean is
// always a float32 product.
template <class T>
bool far_from_mean(double loss, float mean, const SpikeDetectionOptions& options) {
  const T diff = std::abs(static_cast<T>(loss) - static_cast<T>(mean));
  const bool atol = !options.atol || diff >= static_cast<T>(std::abs(*options.atol));
  const bool rtol = !options.rtol || diff >= static_cast<T>(std::abs(static_cast<float>(*options.rtol) * mean));
  return atol && rtol;
}

}  // namespace

SpikeDetection::SpikeDetection(SpikeDetectionOptions options) : options_(std::move(options)) {
  if (options_.window < 1)
    throw MisconfigurationError("SpikeDetection's window must be a positive number of batches, got " +
                                std::to_string(options_.window) + ".");
  if (options_.warmup < 0)
    throw MisconfigurationError("SpikeDetection's warmup must be >= 0 batches, got " + std::to_string(options_.warmup) +
                                ".");
  if ((options_.atol && std::isnan(*options_.atol)) || (options_.rtol && std::isnan(*options_.rtol)))
    throw MisconfigurationError("SpikeDetection's atol and rtol must be numbers (NaN never compares, so no spike "
                                "would ever be found); leave one unset (" + detail::unset_value() +
                                ") to skip that test.");
  sums_.assign(static_cast<std::size_t>(options_.window), 0.0f);
  weights_.assign(static_cast<std::size_t>(options_.window), 0.0f);
}

std::string SpikeDetection::bad_batches_file() const {
  std::filesystem::path path =
      options_.exclude_batches_path.empty() ? std::filesystem::current_path()
                                            : std::filesystem::path(options_.exclude_batches_path);
  if (!options_.exclude_batches_path.ends_with(".json")) path /= "skip_batches.json";
  return path.string();
}

std::vector<std::int64_t> SpikeDetection::read_bad_batches(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error("fulgur: SpikeDetection::read_bad_batches: cannot read '" + path +
                "'; give the skip_batches.json a stopped run wrote (under its exclude_batches_path).");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto malformed = [&] {
    return Error("fulgur: SpikeDetection::read_bad_batches: '" + path + "' is not a JSON list of batch indices: " +
                 text.substr(0, 80));
  };
  // A JSON list of integers: '[', numbers separated by ',', ']', with white space anywhere.
  std::vector<std::int64_t> indices;
  std::size_t at = text.find_first_not_of(" \t\r\n");
  if (at == std::string::npos || text[at] != '[') throw malformed();
  bool expect_number = true, closed = false;
  for (++at; at < text.size() && !closed; ++at) {
    const char c = text[at];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == ']' && (indices.empty() || !expect_number)) {
      closed = true;
    } else if (c == ',' && !expect_number) {
      expect_number = true;
    } else if (expect_number && (c == '-' || std::isdigit(static_cast<unsigned char>(c)))) {
      std::size_t used = 0;
      indices.push_back(std::stoll(text.substr(at, 24), &used));
      at += used - 1;
      expect_number = false;
    } else {
      throw malformed();
    }
  }
  if (!closed || text.find_first_not_of(" \t\r\n", at) != std::string::npos) throw malformed();
  return indices;
}

std::string SpikeDetection::state_key() const {
  return std::string("SpikeDetection{'mode': '") + (options_.mode == MonitorMode::min ? "min" : "max") +
         "', 'window': " + std::to_string(options_.window) + "}";
}

StateDict SpikeDetection::state_dict() const {
  StateDict out;
  out.insert("sums", at::tensor(sums_, at::kFloat));
  out.insert("weights", at::tensor(weights_, at::kFloat));
  out.insert("seen", seen_);
  out.insert("last_value", last_value_);
  out.insert("bad_batches", c10::List<std::int64_t>(bad_batches_));
  return out;
}

void SpikeDetection::load_state_dict(const StateDict& state) {
  const auto bad = [&](const std::string& what) {
    return CheckpointError("fulgur: the checkpoint's " + state_key() + " state " + what +
                           "; it was not written by this detector (resume without it: remove the entry, or give "
                           "the detector another window so that it starts afresh).");
  };
  for (const char* key : {"sums", "weights", "seen", "last_value", "bad_batches"})
    if (!state.contains(key)) throw bad(std::string("has no '") + key + "'");
  const auto slots = [&](const char* key) {
    const c10::IValue value = state.at(key);
    if (!value.isTensor() || value.toTensor().scalar_type() != at::kFloat || value.toTensor().dim() != 1 ||
        value.toTensor().numel() != options_.window)
      throw bad(std::string("'") + key + "' is not " + std::to_string(options_.window) + " float32 slots");
    const at::Tensor t = value.toTensor().contiguous();
    return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  };
  std::vector<float> sums = slots("sums"), weights = slots("weights");
  const c10::IValue seen = state.at("seen"), last = state.at("last_value"), batches = state.at("bad_batches");
  if (!seen.isInt() || seen.toInt() < 0) throw bad("'seen' is not a count");
  if (!last.isDouble()) throw bad("'last_value' is not a number");
  // An empty list comes back from a checkpoint file as a list of unknown element type.
  std::vector<std::int64_t> bad_batches;
  if (batches.isList())
    for (const c10::IValue& index : batches.toListRef()) {
      if (!index.isInt()) throw bad("'bad_batches' is not a list of batch indices");
      bad_batches.push_back(index.toInt());
    }
  else
    throw bad("'bad_batches' is not a list of batch indices");
  sums_ = std::move(sums);
  weights_ = std::move(weights);
  seen_ = seen.toInt();
  last_value_ = last.toDouble();
  bad_batches_ = std::move(bad_batches);
}

double SpikeDetection::running_mean() const {
  // Running.compute: the slots' states summed in slot order, then MeanMetric's sum / weight.
  float sum = 0.0f, weight = 0.0f;
  for (std::size_t i = 0; i < sums_.size(); ++i) {
    sum = sums_[i] + sum;
    weight = weights_[i] + weight;
  }
  return static_cast<double>(sum / weight);
}

bool SpikeDetection::is_spike(const at::Tensor& loss) const {
  const double value = loss.item<double>();
  if (options_.finite_only && !std::isfinite(value)) return true;
  // Not worse than the last loss that entered the window: no spike (the sign of the difference is
  // the same in double as in the loss's dtype; inf - inf is NaN, which is never better).
  const double diff = value - last_value_;
  if (options_.mode == MonitorMode::min ? diff <= 0.0 : diff >= 0.0) return false;
  const auto mean = static_cast<float>(running_mean());
  return loss.scalar_type() == at::kDouble ? far_from_mean<double>(value, mean, options_)
                                           : far_from_mean<float>(value, mean, options_);
}

void SpikeDetection::update(double value) {
  // Running.update: the slot of this update holds MeanMetric's state after it alone; a NaN is
  // dropped by MeanMetric (nan_strategy "warn") but still takes its slot.
  const auto slot = static_cast<std::size_t>(seen_ % options_.window);
  const bool nan = std::isnan(value);
  sums_[slot] = nan ? 0.0f : 0.0f + static_cast<float>(value);
  weights_[slot] = nan ? 0.0f : 1.0f;
  ++seen_;
  last_value_ = value;
}

void SpikeDetection::check(const at::Tensor& loss, std::int64_t batch_idx, std::int64_t global_step, int global_rank,
                           const ReduceDecision& reduce) {
  if (!loss.defined() || loss.numel() != 1 || !loss.is_floating_point())
    throw MisconfigurationError(
        "SpikeDetection checks one floating-point loss per batch; batch " + std::to_string(batch_idx) + " gave " +
        (loss.defined() ? "a tensor of " + std::to_string(loss.numel()) + " elements of dtype " +
                              std::string(c10::toString(loss.scalar_type()))
                        : std::string("an undefined tensor")) +
        ".");
  const bool spiked_here = batch_idx >= options_.warmup && is_spike(loss);
  // Each rank decides on its own losses; any rank's spike stops every rank.
  const bool spiked = reduce ? reduce(spiked_here, false) : spiked_here;
  if (spiked) raise_spike(loss, batch_idx, global_step, global_rank, spiked_here);
  const double value = loss.item<double>();
  // finite_only lets every loss in (a NaN/inf one only reaches here during warm-up); otherwise only
  // the losses of batches finite on every rank enter the window.
  const bool enter = options_.finite_only || (reduce ? reduce(std::isfinite(value), true) : std::isfinite(value));
  if (enter) update(value);
}

void SpikeDetection::raise_spike(const at::Tensor& loss, std::int64_t batch_idx, std::int64_t global_step,
                                 int global_rank, bool spiked_here) {
  // The current batch may hold bad data; the previous one may have corrupted the weights.
  bad_batches_.push_back(batch_idx - 1);
  bad_batches_.push_back(batch_idx);
  const std::string file = bad_batches_file();
  bool written = true;  // by global rank 0; a failure is told in the spike's message, which stays the error
  if (global_rank == 0) {
    const std::filesystem::path parent = std::filesystem::path(file).parent_path();
    std::error_code ignored;
    if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
    std::ofstream out(file, std::ios::trunc);
    out << json_list(bad_batches_);
    written = static_cast<bool>(out.flush());
  }
  const double value = loss.item<double>();
  const double mean = running_mean();
  const std::int64_t in_window = std::min<std::int64_t>(seen_, options_.window);
  std::string why;
  if (!spiked_here)
    why = "another rank's loss spiked (this rank's loss is " + loss_text(value) + ", its running mean " + loss_text(mean) +
          ")";
  else if (!std::isfinite(value))
    why = "the loss is " + loss_text(value) + " (finite_only: a non-finite loss is a spike)";
  else
    why = "the loss " + loss_text(value) + " is " + (options_.mode == MonitorMode::min ? "above" : "below") +
          " its running mean " + loss_text(mean) + " over the last " + std::to_string(in_window) + " batches by " +
          loss_text(std::abs(value - mean)) + " (atol " + (options_.atol ? loss_text(*options_.atol) : "none") + ", rtol " +
          (options_.rtol ? loss_text(*options_.rtol) : "none") + ")";
  throw TrainingSpikeError(
      "fulgur: SpikeDetection: training spike detected in batch " + std::to_string(batch_idx) +
          (global_step >= 0 ? " (global_step " + std::to_string(global_step) + ")" : std::string()) + ": " + why +
          ". Batches " + std::to_string(batch_idx - 1) + " and " + std::to_string(batch_idx) +
          (written ? " are recorded in '" + file + "'"
                   : " could not be recorded in '" + file + "' (set exclude_batches_path to a folder you can write "
                     "to); all so far: " + json_list(bad_batches_)) +
          ": roll back to the last checkpoint and skip them (docs/spike_detection.md).",
      batch_idx, global_step);
}

}  // namespace fulgur
