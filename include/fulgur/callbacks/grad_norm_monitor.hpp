#pragma once
// GradNormMonitor: logs Lightning's grad_norm (grad_norm.hpp) of the module's gradients in
// on_before_optimizer_step — after the loss scaler unscaled them and before clipping, so under
// 16-mixed the values are the true gradients' and with gradient_clip_val the unclipped ones
// (Lightning's documented place for `self.log_dict(grad_norm(self, norm_type=2))`); a fused optimizer
// under the 16-mixed scaler unscales in its kernel, so there, as in Lightning, the gradients are
// still scaled. The values are
// logged as a training step logs (on_step): they reach the loggers and the callback metrics at the
// log cadence. They are computed at the log steps only (the others would be discarded), on the
// device, and stay there: no host sync.
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/grad_norm.hpp"

namespace torch::optim {
class Optimizer;
}

namespace fulgur {

struct GradNormMonitorOptions {
  double norm_type = 2.0;            ///< a positive p, or infinity (std::numeric_limits<double>::infinity())
  std::string group_separator = "/";
  bool prog_bar = false;             ///< also on the progress bar (the total only)
};

class GradNormMonitor {
 public:
  /// Refuses norm_type <= 0 with Lightning's message.
  explicit GradNormMonitor(GradNormMonitorOptions options = {});

  void on_before_optimizer_step(TrainerView& trainer, torch::nn::Module& module, torch::optim::Optimizer&);

 private:
  GradNormMonitorOptions options_;
};

}  // namespace fulgur
