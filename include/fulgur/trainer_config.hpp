#pragma once
// TrainerConfig (what Lightning's Trainer(...) takes), OptimizerConfig (what
// configure_optimizers may return) and FitResult (what fit returns).
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace fulgur {

enum class GradientClipAlgorithm { norm, value };

/// When fit checks that the loss is finite under precisions without a loss scaler.
enum class FiniteLossCheck {
  at_log_steps,  ///< when the loss is read anyway (every log_every_n_steps and each epoch's last batch): no extra sync
  every_step,    ///< every step: stops at the first bad batch, at one host sync per step
  off,
};

/// DDPStrategy's options (Lightning: DDPStrategy(find_unused_parameters=..., timeout=...)).
struct DDPOptions {
  bool find_unused_parameters = false;  ///< off: a parameter without gradient is an error naming it
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< the first gradient bucket, sent early
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< every collective and the rendezvous
};

struct TrainerConfig {
  std::optional<std::int64_t> max_epochs{};  ///< unset with max_steps = -1: 1000, as in Lightning
  std::int64_t max_steps = -1;             ///< -1: no limit
  std::int64_t accumulate_grad_batches = 1;
  std::optional<double> gradient_clip_val{};  ///< unset or 0: no clipping
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::norm;
  std::optional<std::uint64_t> seed{};  ///< seeds torch's generators when the Trainer is built
  bool deterministic = false;         ///< torch deterministic algorithms on
  std::variant<int, std::string> devices = 1;
  int num_nodes = 1;
  std::int64_t check_val_every_n_epoch = 1;
  std::optional<std::int64_t> limit_train_batches{};  ///< batches per epoch at most
  std::optional<std::int64_t> limit_val_batches{};
  std::int64_t log_every_n_steps = 50;
  FiniteLossCheck finite_loss_check = FiniteLossCheck::at_log_steps;
  std::string default_root_dir = ".";
  bool enable_progress_bar = true;  ///< one line per epoch on global rank 0
  DDPOptions ddp{};                 ///< used by DDPStrategy
};

enum class SchedulerInterval { epoch, step };

/// What configure_optimizers may return instead of a bare optimizer.
struct OptimizerConfig {
  std::unique_ptr<torch::optim::Optimizer> optimizer{};
  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler{};  ///< optional
  SchedulerInterval interval = SchedulerInterval::epoch;
  std::int64_t frequency = 1;
};

struct EpochSummary {
  std::int64_t epoch = 0;
  std::int64_t global_step = 0;             ///< after the epoch
  double train_loss = 0.0;                  ///< the epoch's last step's loss (unscaled, per micro-batch)
  std::optional<double> val_loss{};           ///< batch-size-weighted mean over the validation data
  std::int64_t skipped_optimizer_steps = 0; ///< steps a loss scaler skipped on inf/NaN gradients
};

struct FitResult {
  std::vector<EpochSummary> epochs{};
  std::int64_t global_step = 0;  ///< optimizer steps taken or skipped, as Lightning counts them
  std::int64_t skipped_optimizer_steps = 0;
  std::map<std::string, double> metrics{};  ///< last values of logged metrics (ctx.log), train_loss, val_loss
};

}  // namespace fulgur
