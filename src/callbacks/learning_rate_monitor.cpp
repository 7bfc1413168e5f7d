#include "fulgur/callbacks/learning_rate_monitor.hpp"

#include <c10/util/Type.h>
#include <torch/optim.h>

#include <map>
#include <typeinfo>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

/// "Adam" for torch::optim::Adam, "FusedAdam" for fulgur::optim::FusedAdam.
std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  std::string name = c10::demangle(typeid(optimizer).name());
  if (const auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  return name;
}

std::optional<double> momentum_of(torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) return o->momentum();
  if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) return std::get<0>(o->betas());
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return std::get<0>(o->betas());
  if (auto* o = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) return o->momentum();
  return std::nullopt;
}

std::optional<double> weight_decay_of(torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<torch::optim::AdagradOptions*>(&options)) return o->weight_decay();
  return std::nullopt;
}

}  // namespace

void LearningRateMonitor::on_train_start(TrainerView& trainer) {
  if (!trainer.has_loggers())
    throw MisconfigurationError("Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger: " +
                                detail::spelled("add one (fulgur::CSVLogger, fulgur::TensorBoardLogger) to the "
                                                "Trainer's arguments.",
                                                "set trainer.logger (true, CSVLogger or TensorBoardLogger)."));
  names_.clear();
  std::map<std::string, int> seen;
  for (const OptimizerConfig& config : trainer.optimizers()) {
    const std::string base = "lr-" + optimizer_name(*config.optimizer);
    const int n = seen[base]++;
    names_.push_back(n == 0 ? base : base + "-" + std::to_string(n));
  }
}

Metrics LearningRateMonitor::extract(TrainerView& trainer, Which which) {
  Metrics stats;
  const auto optimizers = trainer.optimizers();
  for (std::size_t i = 0; i < optimizers.size() && i < names_.size(); ++i) {
    const OptimizerConfig& config = optimizers[i];
    const bool scheduled = static_cast<bool>(config.lr_scheduler);
    const bool wanted = !scheduled || which == Which::any ||
                        (which == Which::step) == (config.interval == SchedulerInterval::step);
    if (!wanted) continue;
    auto& groups = config.optimizer->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string name = names_[i] + (groups.size() > 1 ? "/pg" + std::to_string(g + 1) : "");
      auto& options = groups[g].options();
      stats[name] = options.get_lr();
      if (options_.log_momentum)
        if (const auto m = momentum_of(options)) stats[name + "-momentum"] = *m;
      if (options_.log_weight_decay)
        if (const auto w = weight_decay_of(options)) stats[name + "-weight_decay"] = *w;
    }
  }
  if (!stats.empty()) {
    trainer.log_metrics(stats, trainer.logging_step());
    last_ = stats;
  }
  return stats;
}

void LearningRateMonitor::on_train_batch_start(TrainerView& trainer) {
  if (options_.logging_interval == SchedulerInterval::epoch) return;
  const bool log_step = (trainer.logging_step() + 1) % trainer.config().log_every_n_steps == 0 || trainer.should_stop();
  if (!log_step) return;
  extract(trainer, options_.logging_interval ? Which::any : Which::step);
}

void LearningRateMonitor::on_train_epoch_start(TrainerView& trainer) {
  if (options_.logging_interval == SchedulerInterval::step) return;
  extract(trainer, options_.logging_interval ? Which::any : Which::epoch);
}

}  // namespace fulgur
