#include "fulgur/callbacks/grad_norm_monitor.hpp"

#include <ATen/ATen.h>

namespace fulgur {

GradNormMonitor::GradNormMonitor(GradNormMonitorOptions options) : options_(std::move(options)) {
  if (!(options_.norm_type > 0))
    throw MisconfigurationError("GradNormMonitor: `norm_type` must be a positive number or 'inf' (infinity norm). Got " +
                                python_float_repr(options_.norm_type));
}

void GradNormMonitor::on_before_optimizer_step(TrainerView& trainer, torch::nn::Module& module, torch::optim::Optimizer&) {
  const std::int64_t every = trainer.config().log_every_n_steps;
  if (every == 0 || ((trainer.logging_step() + 1) % every != 0 && !trainer.should_stop())) return;
  const GradNorms norms = grad_norm_tensors(module, options_.norm_type, options_.group_separator);
  for (std::size_t i = 0; i < norms.names.size(); ++i) {
    const bool total = i + 1 == norms.names.size();
    trainer.log(norms.names[i], norms.values[static_cast<std::int64_t>(i)],
                {.prog_bar = total && options_.prog_bar, .on_step = true, .on_epoch = false});
  }
}

}  // namespace fulgur
