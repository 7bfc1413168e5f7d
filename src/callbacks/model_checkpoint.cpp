// ModelCheckpoint: Lightning's decisions (top-k, last, triggers, file names), fulgur's writes.
#include "fulgur/callbacks/model_checkpoint.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {

namespace {

/// A number as Python's format(value, spec) writes it, for the specs file names use (.3f, .2e, d, ...).
std::string formatted(double value, const std::string& spec, bool integral) {
  if (spec.empty()) {
    if (integral) return std::to_string(static_cast<long long>(value));
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;  // shortest round trip, as Python's repr
    std::string out(text, end);
    if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
    return out;
  }
  char text[64];
  if (spec.back() == 'd') {
    std::snprintf(text, sizeof text, ("%" + spec.substr(0, spec.size() - 1) + "lld").c_str(), static_cast<long long>(value));
  } else {
    std::snprintf(text, sizeof text, ("%" + spec).c_str(), value);
  }
  return text;
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  if (options_.save_top_k < -1)
    throw MisconfigurationError("Invalid value for save_top_k=" + std::to_string(options_.save_top_k) + ". Must be >= -1");
  if (options_.monitor.empty() && options_.save_top_k != -1 && options_.save_top_k != 0 && options_.save_top_k != 1)
    throw MisconfigurationError("ModelCheckpoint(save_top_k=" + std::to_string(options_.save_top_k) +
                                ", monitor=None) is not a valid configuration. No quantity for top_k to track; set "
                                "monitor (e.g. \"val_loss\") or save_top_k to -1, 0 or 1.");
  if (options_.every_n_train_steps < 0)
    throw MisconfigurationError("Invalid value for every_n_train_steps=" + std::to_string(options_.every_n_train_steps) +
                                ". Must be >= 0");
  if (options_.every_n_epochs && *options_.every_n_epochs < 0)
    throw MisconfigurationError("Invalid value for every_n_epochs=" + std::to_string(*options_.every_n_epochs) + ". Must be >= 0");
  const int triggers = (options_.every_n_train_steps > 0) + (options_.every_n_epochs.value_or(0) > 0) +
                       options_.train_time_interval.has_value();
  if (triggers > 1)
    throw MisconfigurationError("Combination of parameters every_n_train_steps=" + std::to_string(options_.every_n_train_steps) +
                                ", every_n_epochs=" + std::to_string(options_.every_n_epochs.value_or(0)) +
                                " and train_time_interval should be mutually exclusive: give one of them.");
  if (!options_.every_n_epochs)
    options_.every_n_epochs = options_.every_n_train_steps == 0 && !options_.train_time_interval ? 1 : 0;
}

std::vector<std::string> ModelCheckpoint::checkpoint_folders(const std::string& /*default_root_dir*/) const {
  if (!dirpath_.empty()) return {dirpath_};
  if (!options_.dirpath.empty()) return {detail::absolute_path(options_.dirpath)};
  return {};
}

std::string ModelCheckpoint::state_key() const {
  char interval[64] = "None";
  if (options_.train_time_interval) std::snprintf(interval, sizeof interval, "%g", options_.train_time_interval->count());
  return "ModelCheckpoint{'monitor': " + (options_.monitor.empty() ? std::string("None") : "'" + options_.monitor + "'") +
         ", 'mode': '" + (options_.mode == MonitorMode::min ? "min" : "max") +
         "', 'every_n_train_steps': " + std::to_string(options_.every_n_train_steps) +
         ", 'every_n_epochs': " + std::to_string(options_.every_n_epochs.value_or(0)) + ", 'train_time_interval': " + interval + "}";
}

void ModelCheckpoint::setup(TrainerView& trainer, Stage stage) {
  if (stage != Stage::fit) return;
  validation_has_run_ = false;  // a new fit (Lightning: a new val loop, _has_run false)
  warned_missing_monitor_ = false;
  // From the root: a relative dirpath is taken from the current directory (as in Lightning), the
  // default already holds default_root_dir, and the save must not put it under the root again.
  if (!options_.dirpath.empty())
    dirpath_ = detail::absolute_path(options_.dirpath);
  else
    dirpath_ = detail::absolute_path((trainer.has_loggers() ? trainer.log_dir() : trainer.config().default_root_dir) +
                                     "/checkpoints");
  dirpath_ = trainer.broadcast(dirpath_);
  detail::require_creatable_folder(dirpath_, "ModelCheckpoint's dirpath");  // now, not after the first epoch
}

void ModelCheckpoint::on_train_start(TrainerView&) { last_time_check_ = std::chrono::steady_clock::now(); }

bool ModelCheckpoint::skip(const TrainerView& trainer) const {
  return trainer.stage() != Stage::fit || trainer.sanity_checking() || last_global_step_saved_ == trainer.global_step();
}

bool ModelCheckpoint::save_on_train_epoch_end(const TrainerView& trainer) const {
  if (options_.save_on_train_epoch_end) return *options_.save_on_train_epoch_end;
  const TrainerConfig& config = trainer.config();
  if (config.check_val_every_n_epoch != 1) return false;
  if (config.limit_val_batches.is_zero() || !trainer.has_validation()) return true;  // no validation: the epoch's end
  return config.val_check_interval.is_all();
}

void ModelCheckpoint::on_train_batch_end(TrainerView& trainer) {
  if (skip(trainer)) return;
  const bool skip_batch = options_.every_n_train_steps < 1 || trainer.global_step() % options_.every_n_train_steps != 0;
  bool skip_time = true;
  if (options_.train_time_interval) {
    const auto now = std::chrono::steady_clock::now();
    skip_time = !trainer.reduce_boolean_decision(now - last_time_check_ >= *options_.train_time_interval, /*all=*/false);
    if (!skip_time) last_time_check_ = now;
  }
  if (skip_batch && skip_time) return;
  save(trainer);
}

bool ModelCheckpoint::epoch_due(const TrainerView& trainer) const {
  const std::int64_t every = options_.every_n_epochs.value_or(0);  // the constructor resolved the default
  return every >= 1 && (trainer.current_epoch() + 1) % every == 0;
}

void ModelCheckpoint::on_train_epoch_end(TrainerView& trainer) {
  if (skip(trainer) || !save_on_train_epoch_end(trainer)) return;
  if (epoch_due(trainer)) save(trainer);
}

void ModelCheckpoint::on_validation_end(TrainerView& trainer) {
  // Lightning's val_loop._has_run: a validation of fit (not the sanity check) ran a batch. From then on a
  // monitor missing from the metrics is a misconfiguration, not a metric still to come.
  if (trainer.stage() == Stage::fit && !trainer.sanity_checking() && trainer.num_evaluation_batches() != 0)
    validation_has_run_ = true;
  if (skip(trainer) || save_on_train_epoch_end(trainer)) return;
  if (epoch_due(trainer)) save(trainer);
}

void ModelCheckpoint::save(TrainerView& trainer) {
  last_global_step_saved_ = trainer.global_step();
  save_top_k(trainer);
  if (options_.save_last) save_last(trainer);
}

bool ModelCheckpoint::better(double a, double b) const { return options_.mode == MonitorMode::min ? a < b : a > b; }

std::optional<double> ModelCheckpoint::monitored(const TrainerView& trainer) const {
  if (std::optional<double> value = trainer.metric(options_.monitor)) return value;
  // Lightning's _monitor_candidates add the epoch and the step to the callback metrics.
  if (options_.monitor == "epoch") return static_cast<double>(trainer.current_epoch());
  if (options_.monitor == "step") return static_cast<double>(trainer.global_step());
  return std::nullopt;
}

void ModelCheckpoint::save_top_k(TrainerView& trainer) {
  if (options_.save_top_k == 0) return;
  if (options_.monitor.empty()) {  // the latest only (save_top_k 1) or every one (-1)
    const std::string previous = best_model_path_;
    best_model_path_ = unique_path(trainer, format_name(trainer), previous);
    trainer.save_checkpoint(best_model_path_, options_.save_weights_only);
    if (options_.save_top_k == 1 && !previous.empty() && previous != best_model_path_) trainer.remove_checkpoint(previous);
    return;
  }
  const std::optional<double> value = monitored(trainer);
  if (!value) {
    // Lightning's _save_topk_checkpoint: an error once validation has run (the key will never come), a
    // warning (once) before, when the metric may be logged by a validation still to run.
    std::string candidates;
    for (const std::string& name : trainer.callback_metrics().names()) candidates += "'" + name + "', ";
    const std::string text = "`ModelCheckpoint(monitor='" + options_.monitor + "')` could not find the monitored key "
                             "in the returned metrics: [" + candidates + "'epoch', 'step']. HINT: Did you call "
                             "`ctx.log(\"" + options_.monitor + "\", value)` in the module?";
    if (validation_has_run_) throw MisconfigurationError(text);
    if (!warned_missing_monitor_) trainer.warn("fulgur: " + text);  // printed on rank 0, kept in FitResult::warnings
    warned_missing_monitor_ = true;
    return;
  }
  double current = *value;
  if (std::isnan(current))
    current = options_.mode == MonitorMode::min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  current_score_ = current;
  const auto k = static_cast<std::size_t>(options_.save_top_k);
  bool should_save = options_.save_top_k == -1 || best_k_models_.size() < k ||
                     better(current, best_k_models_.at(kth_best_model_path_));
  should_save = trainer.reduce_boolean_decision(should_save, /*all=*/true);  // the ranks agree
  if (!should_save) {
    if (options_.verbose)
      trainer.print("Epoch " + std::to_string(trainer.current_epoch()) + ", global step " +
                    std::to_string(trainer.global_step()) + ": '" + options_.monitor + "' was not in top " +
                    std::to_string(options_.save_top_k));
    return;
  }
  const std::size_t keep = options_.save_top_k == -1 ? best_k_models_.size() + 1 : k;
  std::string removed;
  if (best_k_models_.size() == keep && keep > 0) {
    removed = kth_best_model_path_;
    best_k_models_.erase(removed);
  }
  const std::string path = unique_path(trainer, format_name(trainer), removed);
  best_k_models_[path] = current;
  auto worst = best_k_models_.begin(), best = best_k_models_.begin();
  for (auto it = best_k_models_.begin(); it != best_k_models_.end(); ++it) {
    if (better(worst->second, it->second)) worst = it;
    if (better(it->second, best->second)) best = it;
  }
  if (best_k_models_.size() == keep) kth_best_model_path_ = worst->first;
  best_model_path_ = best->first;
  best_model_score_ = best->second;
  if (options_.verbose) {
    char text[64];
    std::snprintf(text, sizeof text, "%.5f", current);
    trainer.print("Epoch " + std::to_string(trainer.current_epoch()) + ", global step " +
                  std::to_string(trainer.global_step()) + ": '" + options_.monitor + "' reached " + text +
                  " (best " + std::to_string(*best_model_score_) + "), saving model to '" + path + "' as top " +
                  std::to_string(options_.save_top_k));
  }
  trainer.save_checkpoint(path, options_.save_weights_only);
  if (!removed.empty() && removed != path) trainer.remove_checkpoint(removed);
}

void ModelCheckpoint::save_last(TrainerView& trainer) {
  const std::string previous = last_model_path_;
  last_model_path_ = unique_path(trainer, "last", previous);
  trainer.save_checkpoint(last_model_path_, options_.save_weights_only);
  if (!previous.empty() && previous != last_model_path_) trainer.remove_checkpoint(previous);
}

std::string ModelCheckpoint::format_name(TrainerView& trainer) const {
  const std::string& t = options_.filename;
  std::string out;
  for (std::size_t i = 0; i < t.size();) {
    if (t[i] != '{') {
      out += t[i++];
      continue;
    }
    const std::size_t close = t.find('}', i);
    if (close == std::string::npos)
      throw MisconfigurationError("ModelCheckpoint: the filename template '" + t + "' has a '{' without its '}'.");
    const std::string field = t.substr(i + 1, close - i - 1);
    const std::size_t colon = field.find(':');
    const std::string name = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    double value = 0.0;
    bool integral = false;
    if (name == "epoch") value = static_cast<double>(trainer.current_epoch()), integral = true;
    else if (name == "step") value = static_cast<double>(trainer.global_step()), integral = true;
    else value = trainer.metric(name).value_or(0.0);  // Lightning writes 0 for a metric not logged
    if (options_.auto_insert_metric_name) out += name + "=";
    out += formatted(value, spec, integral);
    i = close + 1;
  }
  return out;
}

std::string ModelCheckpoint::unique_path(TrainerView& trainer, const std::string& name, const std::string& previous) const {
  std::string path = dirpath_ + "/" + name + ".ckpt";
  for (int version = 1; options_.enable_version_counter; ++version) {
    const bool taken = trainer.reduce_boolean_decision(detail::path_exists(path) && path != previous, /*all=*/false);
    if (!taken) break;
    path = dirpath_ + "/" + name + "-v" + std::to_string(version) + ".ckpt";
  }
  return path;
}

StateDict ModelCheckpoint::state_dict() const {
  StateDict out;
  out.insert("monitor", options_.monitor.empty() ? c10::IValue() : c10::IValue(options_.monitor));
  out.insert("best_model_score", best_model_score_ ? c10::IValue(*best_model_score_) : c10::IValue());
  out.insert("best_model_path", best_model_path_);
  out.insert("current_score", current_score_ ? c10::IValue(*current_score_) : c10::IValue());
  out.insert("dirpath", dirpath_);
  c10::impl::GenericDict best_k(c10::StringType::get(), c10::FloatType::get());
  for (const auto& [path, score] : best_k_models_) best_k.insert(path, score);
  out.insert("best_k_models", best_k);
  out.insert("kth_best_model_path", kth_best_model_path_);
  out.insert("kth_value", best_k_models_.count(kth_best_model_path_) ? c10::IValue(best_k_models_.at(kth_best_model_path_)) : c10::IValue());
  out.insert("last_model_path", last_model_path_);
  out.insert("last_global_step_saved", last_global_step_saved_);
  return out;
}

void ModelCheckpoint::load_state_dict(const StateDict& state) {
  auto text = [&](const char* key) { return state.contains(key) && state.at(key).isString() ? state.at(key).toStringRef() : std::string(); };
  const std::string saved_dir = text("dirpath");
  best_model_path_ = text("best_model_path");
  if (saved_dir != dirpath_) {
    std::cerr << "fulgur: the ModelCheckpoint dirpath has changed from '" << saved_dir << "' to '" << dirpath_
              << "', therefore best_model_score, kth_best_model_path, kth_value, last_model_path and best_k_models "
                 "won't be reloaded. Only best_model_path will be reloaded." << std::endl;
    return;
  }
  if (state.contains("best_model_score") && state.at("best_model_score").isDouble()) best_model_score_ = state.at("best_model_score").toDouble();
  if (state.contains("current_score") && state.at("current_score").isDouble()) current_score_ = state.at("current_score").toDouble();
  kth_best_model_path_ = text("kth_best_model_path");
  last_model_path_ = text("last_model_path");
  best_k_models_.clear();
  if (state.contains("best_k_models") && state.at("best_k_models").isGenericDict())
    for (const auto& item : state.at("best_k_models").toGenericDict())
      best_k_models_[item.key().toStringRef()] = item.value().toDouble();
  if (state.contains("last_global_step_saved")) last_global_step_saved_ = state.at("last_global_step_saved").toInt();
}

}  // namespace fulgur
