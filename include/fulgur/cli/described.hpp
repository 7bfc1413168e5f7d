#pragma once
// The field lists of fulgur's own settings, as the CLI reads them: TrainerConfig (Lightning's
// Trainer(...) arguments, `seed` aside: it is `seed_everything`), the strategies' options, and the
// enums' names. The docs are what --help prints.
#include <array>
#include <string_view>
#include <tuple>
#include <utility>

#include "fulgur/cli/values.hpp"
#include "fulgur/distributed/data_parallel.hpp"
#include "fulgur/strategies/sharded/options.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::cli {

template <>
struct enum_names<GradientClipAlgorithm> {
  static constexpr std::array values{std::pair{GradientClipAlgorithm::norm, std::string_view("norm")},
                                     std::pair{GradientClipAlgorithm::value, std::string_view("value")}};
};
template <>
struct enum_names<FiniteLossCheck> {
  static constexpr std::array values{std::pair{FiniteLossCheck::at_log_steps, std::string_view("at_log_steps")},
                                     std::pair{FiniteLossCheck::every_step, std::string_view("every_step")},
                                     std::pair{FiniteLossCheck::off, std::string_view("off")}};
};
template <>
struct enum_names<StateDictType> {
  static constexpr std::array values{std::pair{StateDictType::sharded, std::string_view("sharded")},
                                     std::pair{StateDictType::full, std::string_view("full")}};
};

/// A count of batches (an integer) or a fraction of them (a float; 1.0 is all).
template <>
struct value_traits<BatchAmount> {
  static std::string type() { return "int | float"; }
  static bool read(const YAML::Node& node, BatchAmount& value) {
    if (const auto count = as_integer(node)) {
      value = BatchAmount(static_cast<std::int64_t>(*count));
      return true;
    }
    if (const auto fraction = as_number(node)) {
      value = BatchAmount(*fraction);
      return true;
    }
    return false;
  }
  static YAML::Node write(const BatchAmount& value) {
    return YAML::Node(value.is_fraction() ? number_text(value.fraction()) : std::to_string(value.count()));
  }
};

template <>
struct describe<PreemptionOptions> {
  static constexpr auto fields() {
    using O = PreemptionOptions;
    return std::tuple(
        field("enabled", &O::enabled, "SIGTERM/SIGUSR1 during fit: finish the batch, checkpoint, exit (false: leave the signals alone)"),
        field("auto_requeue", &O::auto_requeue, "in a SLURM batch job: `scontrol requeue` after the save"),
        field("exit_process", &O::exit_process, "after the save: exit with exit_code (false: fit returns)"),
        field("exit_code", &O::exit_code, "the process's exit code after a preemption save (1-255)"));
  }
};

template <>
struct describe<TrainerConfig> {
  static constexpr auto fields() {
    using C = TrainerConfig;
    return std::tuple(
        field("max_epochs", &C::max_epochs, "stop after this many epochs; null with max_steps -1: 1000; -1: no limit"),
        field("min_epochs", &C::min_epochs, "a stop request waits until this many epochs ran"),
        field("max_steps", &C::max_steps, "stop after this many optimizer steps; -1: no limit"),
        field("min_steps", &C::min_steps, "a stop request waits until this many steps ran"),
        field("max_time", &C::max_time, "stop after this much wall time of fit"),
        field("accumulate_grad_batches", &C::accumulate_grad_batches, "batches whose gradients add up to one optimizer step"),
        field("gradient_clip_val", &C::gradient_clip_val, "clip gradients at this value or norm; null or 0: no clipping"),
        field("gradient_clip_algorithm", &C::gradient_clip_algorithm, "clip by the total norm or by value"),
        field("deterministic", &C::deterministic, "torch's deterministic algorithms"),
        field("devices", &C::devices, "devices per node: a count, 'auto', or indices as '0,1'"),
        field("num_nodes", &C::num_nodes, "nodes of the run"),
        field("max_restarts", &C::max_restarts, "fulgur's launcher: restart the workers this many times after a failure"),
        field("val_check_interval", &C::val_check_interval, "validate every N training batches (int) or fraction of an epoch (float)"),
        field("check_val_every_n_epoch", &C::check_val_every_n_epoch, "validate every N epochs; null: val_check_interval counts batches across epochs"),
        field("num_sanity_val_steps", &C::num_sanity_val_steps, "validation batches run before training; -1: all"),
        field("limit_train_batches", &C::limit_train_batches, "training batches per epoch: a count or a fraction"),
        field("limit_val_batches", &C::limit_val_batches, "validation batches per run: a count or a fraction"),
        field("limit_test_batches", &C::limit_test_batches, "test batches: a count or a fraction"),
        field("limit_predict_batches", &C::limit_predict_batches, "predict batches: a count or a fraction"),
        field("log_every_n_steps", &C::log_every_n_steps, "step metrics reach the loggers this often"),
        field("finite_loss_check", &C::finite_loss_check, "when fit checks that the loss is finite"),
        field("max_consecutive_skipped_steps", &C::max_consecutive_skipped_steps, "16-mixed: stop after this many skipped steps in a row; 0: never"),
        field("detect_anomaly", &C::detect_anomaly, "autograd anomaly mode; a NaN/inf gradient is an error naming the parameters"),
        field("default_root_dir", &C::default_root_dir, "where logs and checkpoints go by default"),
        field("enable_progress_bar", &C::enable_progress_bar, "draw the progress bar (rank 0)"),
        field("handle_interrupt", &C::handle_interrupt, "Ctrl-C finishes the step, tears down and returns"),
        field("preemption", &C::preemption, "SIGTERM/SIGUSR1 handling"));
  }
};

template <>
struct describe<DDPOptions> {
  static constexpr auto fields() {
    using O = DDPOptions;
    return std::tuple(
        field("find_unused_parameters", &O::find_unused_parameters, "allow parameters without gradient (false: an error naming them)"),
        field("first_bucket_bytes", &O::first_bucket_bytes, "bytes of the first gradient bucket, sent early"),
        field("bucket_bytes", &O::bucket_bytes, "bytes per gradient bucket"),
        field("timeout", &O::timeout, "every collective and the rendezvous"),
        field("sync_batchnorm", &O::sync_batchnorm, "BatchNorm layers become SyncBatchNorm at set-up"));
  }
};

template <>
struct describe<FSDPOptions> {
  static constexpr auto fields() {
    using O = FSDPOptions;
    return std::tuple(
        field("state_dict_type", &O::state_dict_type, "checkpoint weights as per-rank shards or whole tensors"),
        field("find_unused_parameters", &O::find_unused_parameters, "allow parameters without gradient"),
        field("timeout", &O::timeout, "every collective and the rendezvous"),
        field("sync_batchnorm", &O::sync_batchnorm, "BatchNorm layers become SyncBatchNorm at set-up"));
  }
};

}  // namespace fulgur::cli
