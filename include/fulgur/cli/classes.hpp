#pragma once
// The callbacks and loggers a CLI config can name (trainer.callbacks / trainer.logger, Lightning's
// class_path + init_args): class_info<C> gives each one's name, the other names accepted for it
// (Lightning's class paths, so a Lightning YAML reads as is), its init_args (a described struct) and
// how to build it from them. A program's own callback joins by specializing class_info.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

#include "fulgur/callbacks/early_stopping.hpp"
#include "fulgur/callbacks/learning_rate_monitor.hpp"
#include "fulgur/callbacks/model_checkpoint.hpp"
#include "fulgur/callbacks/model_summary.hpp"
#include "fulgur/callbacks/on_exception_checkpoint.hpp"
#include "fulgur/callbacks/spike_detection.hpp"
#include "fulgur/callbacks/timer.hpp"
#include "fulgur/cli/described.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loggers/csv_logger.hpp"
#include "fulgur/loggers/tensorboard_logger.hpp"

namespace fulgur::cli {

/// Specialize: name, aliases, doc, `using args_type` (described), static C make(const args_type&).
template <class C>
struct class_info;

template <class C>
concept configurable_class = requires(const typename class_info<C>::args_type& args) {
  { class_info<C>::name } -> std::convertible_to<std::string_view>;
  { class_info<C>::make(args) } -> std::same_as<C>;
  requires described<typename class_info<C>::args_type>;
};

/// A list of callback and logger types (the classes a program's configs may name).
template <class... C>
struct class_list {
  static_assert((configurable_class<C> && ...),
                "fulgur::cli: each class in a class_list needs a fulgur::cli::class_info specialization "
                "(name, args_type, make) — see fulgur/cli/classes.hpp");
};

// ---- enums and option structs of the shipped callbacks -------------------------------------------

template <>
struct enum_names<MonitorMode> {
  static constexpr std::array values{std::pair{MonitorMode::min, std::string_view("min")},
                                     std::pair{MonitorMode::max, std::string_view("max")}};
};
template <>
struct enum_names<SchedulerInterval> {
  static constexpr std::array values{std::pair{SchedulerInterval::epoch, std::string_view("epoch")},
                                     std::pair{SchedulerInterval::step, std::string_view("step")}};
};
template <>
struct enum_names<TimerInterval> {
  static constexpr std::array values{std::pair{TimerInterval::step, std::string_view("step")},
                                     std::pair{TimerInterval::epoch, std::string_view("epoch")}};
};

template <>
struct describe<EarlyStoppingOptions> {
  static constexpr auto fields() {
    using O = EarlyStoppingOptions;
    return std::tuple(field("monitor", &O::monitor, "the metric watched, e.g. val_loss"),
                      field("min_delta", &O::min_delta, "the least change that counts as an improvement"),
                      field("patience", &O::patience, "checks without improvement before stopping"),
                      field("verbose", &O::verbose, "say why at each check"),
                      field("mode", &O::mode, "whether lower or higher is better"),
                      field("strict", &O::strict, "a monitor never logged is an error"),
                      field("check_finite", &O::check_finite, "a NaN/inf monitor stops at once"),
                      field("stopping_threshold", &O::stopping_threshold, "stop once the monitor is better than this"),
                      field("divergence_threshold", &O::divergence_threshold, "stop once the monitor is worse than this"),
                      field("check_on_train_epoch_end", &O::check_on_train_epoch_end,
                            "check at the training epoch's end (null: after validation)"));
  }
};

template <>
struct describe<ModelCheckpointOptions> {
  static constexpr auto fields() {
    using O = ModelCheckpointOptions;
    return std::tuple(
        field("dirpath", &O::dirpath, "folder of the checkpoints (empty: the logger's log_dir/checkpoints)"),
        field("filename", &O::filename, "name template, e.g. '{epoch}-{val_loss:.3f}'"),
        field("monitor", &O::monitor, "the metric ranking checkpoints (empty: the latest)"),
        field("mode", &O::mode, "whether lower or higher is better"),
        field("save_top_k", &O::save_top_k, "best checkpoints kept; -1: all"),
        field("save_last", &O::save_last, "also write last.ckpt at each save"),
        field("save_weights_only", &O::save_weights_only, "weights and position only"),
        field("auto_insert_metric_name", &O::auto_insert_metric_name, "'{val_loss}' becomes 'val_loss=0.12'"),
        field("verbose", &O::verbose, "say what was saved"),
        field("every_n_train_steps", &O::every_n_train_steps, "save every N training steps; 0: off"),
        field("train_time_interval", &O::train_time_interval, "save every so much training time"),
        field("every_n_epochs", &O::every_n_epochs, "save every N epochs"),
        field("save_on_train_epoch_end", &O::save_on_train_epoch_end, "save at the training epoch's end"),
        field("enable_version_counter", &O::enable_version_counter, "a taken name gets -v1, -v2, ..."));
  }
};

template <>
struct describe<LearningRateMonitorOptions> {
  static constexpr auto fields() {
    using O = LearningRateMonitorOptions;
    return std::tuple(field("logging_interval", &O::logging_interval, "log per step or epoch (null: each scheduler's own)"),
                      field("log_momentum", &O::log_momentum, "also log momentum"),
                      field("log_weight_decay", &O::log_weight_decay, "also log weight decay"));
  }
};

template <>
struct describe<TimerOptions> {
  static constexpr auto fields() {
    using O = TimerOptions;
    return std::tuple(field("duration", &O::duration, "stop fit after this much time (null: only measure)"),
                      field("interval", &O::interval, "check after each step or epoch"),
                      field("verbose", &O::verbose, "say when the limit is reached"));
  }
};

/// ModelSummary's and the loggers' constructor arguments, as described structs.
struct ModelSummaryArgs {
  int max_depth = 1;
  static constexpr auto fields() {
    return std::tuple(field("max_depth", &ModelSummaryArgs::max_depth, "layers shown: 1 the children, -1 all"));
  }
};
struct LoggerArgs {
  std::string save_dir{};
  std::string name = "lightning_logs";
  std::optional<std::variant<std::int64_t, std::string>> version{};
  std::string prefix{};
  LoggerOptions options() const { return {.save_dir = save_dir, .name = name, .version = version, .prefix = prefix}; }
};
struct CSVLoggerArgs : LoggerArgs {
  std::int64_t flush_logs_every_n_steps = 100;
  static constexpr auto fields() {
    using A = CSVLoggerArgs;
    return std::tuple(field("save_dir", &A::save_dir, "empty: trainer.default_root_dir"),
                      field("name", &A::name, "the run's folder under save_dir"),
                      field("version", &A::version, "version_N or a folder name (null: the next version)"),
                      field("prefix", &A::prefix, "put before every metric name"),
                      field("flush_logs_every_n_steps", &A::flush_logs_every_n_steps, "write metrics.csv this often"));
  }
};
struct TensorBoardLoggerArgs : LoggerArgs {
  bool default_hp_metric = true;
  static constexpr auto fields() {
    using A = TensorBoardLoggerArgs;
    return std::tuple(field("save_dir", &A::save_dir, "empty: trainer.default_root_dir"),
                      field("name", &A::name, "the run's folder under save_dir"),
                      field("version", &A::version, "version_N or a folder name (null: the next version)"),
                      field("prefix", &A::prefix, "put before every metric name"),
                      field("default_hp_metric", &A::default_hp_metric, "log hp_metric -1 with the hyper-parameters"));
  }
};

// ---- the shipped classes -------------------------------------------------------------------------

template <>
struct describe<OnExceptionCheckpointOptions> {
  static constexpr auto fields() {
    using O = OnExceptionCheckpointOptions;
    return std::tuple(field("dirpath", &O::dirpath, "folder of the checkpoint an exception leaving fit writes"),
                      field("filename", &O::filename, "its name, without the .ckpt extension"));
  }
};

template <>
struct describe<SpikeDetectionOptions> {
  static constexpr auto fields() {
    using O = SpikeDetectionOptions;
    return std::tuple(field("mode", &O::mode, "min: a rise of the loss is a spike; max: a fall is"),
                      field("window", &O::window, "batches in the running mean the loss is compared with"),
                      field("warmup", &O::warmup, "batch indices of each epoch below this are never a spike"),
                      field("atol", &O::atol, "a spike differs from the running mean by at least this (null: any)"),
                      field("rtol", &O::rtol, "... and by at least rtol times the running mean (null: any)"),
                      field("exclude_batches_path", &O::exclude_batches_path,
                            "folder (or .json path) of skip_batches.json (empty: the working directory)"),
                      field("finite_only", &O::finite_only, "a NaN/inf loss is a spike"));
  }
};

/// SpikeDetection as a config names it. Every Trainer a CLI program compiles holds each shipped class,
/// so a module whose training_step returns no loss must still compile; naming the detector for such a
/// module is then an error at the first batch rather than SpikeDetection's static_assert.
class ConfiguredSpikeDetection : public SpikeDetection {
 public:
  using SpikeDetection::SpikeDetection;
  template <class Output, class Batch>
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module& module, const Output& output, const Batch& batch,
                          std::int64_t batch_idx) {
    if constexpr (fulgur::detail::has_loss<Output>)
      SpikeDetection::on_train_batch_end(trainer, module, output, batch, batch_idx);
    else
      throw MisconfigurationError("fulgur: the config names SpikeDetection, which watches the training loss, but "
                                  "this module's training_step returns no loss (a tensor, or a struct with a `loss` "
                                  "member): return it, or leave SpikeDetection out of trainer.callbacks.");
  }
};

#define FULGUR_CLI_LIGHTNING_ALIASES(package, name) \
  std::array<std::string_view, 2> { "lightning.pytorch." package "." name, "pytorch_lightning." package "." name }

template <>
struct class_info<EarlyStopping> {
  static constexpr std::string_view name = "EarlyStopping";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "EarlyStopping");
  static constexpr std::string_view doc = "stop when a monitored metric stops improving";
  using args_type = EarlyStoppingOptions;
  static EarlyStopping make(const args_type& args) { return EarlyStopping(args); }
};
template <>
struct class_info<ModelCheckpoint> {
  static constexpr std::string_view name = "ModelCheckpoint";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "ModelCheckpoint");
  static constexpr std::string_view doc = "save checkpoints: the best by a metric, the last";
  using args_type = ModelCheckpointOptions;
  static ModelCheckpoint make(const args_type& args) { return ModelCheckpoint(args); }
};
template <>
struct class_info<OnExceptionCheckpoint> {
  static constexpr std::string_view name = "OnExceptionCheckpoint";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "OnExceptionCheckpoint");
  static constexpr std::string_view doc = "on an exception, a checkpoint of the last completed step";
  using args_type = OnExceptionCheckpointOptions;
  static OnExceptionCheckpoint make(const args_type& args) { return OnExceptionCheckpoint(args); }
};
template <>
struct class_info<ConfiguredSpikeDetection> {
  static constexpr std::string_view name = "SpikeDetection";  // Lightning Fabric's: no Trainer class path
  static constexpr std::string_view doc = "stop on a loss spike; record the bad batches to skip";
  using args_type = SpikeDetectionOptions;
  static ConfiguredSpikeDetection make(const args_type& args) { return ConfiguredSpikeDetection(args); }
};
template <>
struct class_info<LearningRateMonitor> {
  static constexpr std::string_view name = "LearningRateMonitor";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "LearningRateMonitor");
  static constexpr std::string_view doc = "log the learning rates";
  using args_type = LearningRateMonitorOptions;
  static LearningRateMonitor make(const args_type& args) { return LearningRateMonitor(args); }
};
template <>
struct class_info<Timer> {
  static constexpr std::string_view name = "Timer";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "Timer");
  static constexpr std::string_view doc = "measure the stages' time; stop fit after a duration";
  using args_type = TimerOptions;
  static Timer make(const args_type& args) { return Timer(args); }
};
template <>
struct class_info<ModelSummary> {
  static constexpr std::string_view name = "ModelSummary";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("callbacks", "ModelSummary");
  static constexpr std::string_view doc = "print the module's layers and parameter counts at fit start";
  using args_type = ModelSummaryArgs;
  static ModelSummary make(const args_type& args) { return ModelSummary(args.max_depth); }
};
template <>
struct class_info<CSVLogger> {
  static constexpr std::string_view name = "CSVLogger";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("loggers", "CSVLogger");
  static constexpr std::string_view doc = "metrics.csv and hparams.yaml";
  using args_type = CSVLoggerArgs;
  static CSVLogger make(const args_type& args) { return CSVLogger(args.options(), args.flush_logs_every_n_steps); }
};
template <>
struct class_info<TensorBoardLogger> {
  static constexpr std::string_view name = "TensorBoardLogger";
  static constexpr auto aliases = FULGUR_CLI_LIGHTNING_ALIASES("loggers", "TensorBoardLogger");
  static constexpr std::string_view doc = "event files TensorBoard reads";
  using args_type = TensorBoardLoggerArgs;
  static TensorBoardLogger make(const args_type& args) {
    return TensorBoardLogger(args.options(), {.default_hp_metric = args.default_hp_metric});
  }
};
#undef FULGUR_CLI_LIGHTNING_ALIASES

/// What a CLI program can name by default: fulgur's callbacks and loggers. The checkpoint callbacks come
/// last, so that their hooks run after the others' (Lightning moves checkpoint callbacks to the end too).
using shipped_classes = class_list<EarlyStopping, LearningRateMonitor, Timer, ModelSummary, ConfiguredSpikeDetection,
                                   CSVLogger, TensorBoardLogger, OnExceptionCheckpoint, ModelCheckpoint>;

/// The choice a slot offers for class C.
template <class C>
ClassChoice choice_of() {
  using I = class_info<C>;
  ClassChoice choice{.name = std::string(I::name), .aliases = {}, .doc = std::string(I::doc),
                     .init_args = schema_of<typename I::args_type>()};
  if constexpr (requires { I::aliases; })
    for (const auto& alias : I::aliases) choice.aliases.emplace_back(alias);
  return choice;
}

}  // namespace fulgur::cli
