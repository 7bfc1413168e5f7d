// examples/extending/grad_norm_monitor.hpp
#pragma once
// A callback of your own: the gradients' global norm, logged before each optimizer step (the hook
// runs after unscaling, so under '16-mixed' it sees the true gradients).
#include <fulgur/fulgur.hpp>

struct GradNormMonitor {
  void on_before_optimizer_step(fulgur::TrainerView& trainer, torch::nn::Module& module, torch::optim::Optimizer&) {
    std::vector<at::Tensor> norms;
    for (const auto& p : module.parameters())
      if (p.grad().defined()) norms.push_back(p.grad().detach().norm());
    if (!norms.empty()) trainer.log("grad_norm", at::stack(norms).norm(), {.on_step = true, .on_epoch = false});
  }
};
