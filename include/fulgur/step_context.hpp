#pragma once
// StepContext: what a step or hook that asks for it (as its last parameter) receives — where the
// loop is, `log`, a stop request, and, under manual optimization, the optimizers and
// manual_backward. Logging stores a detached tensor (no host sync); values reach the host at the
// log cadence and at epoch ends.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/detail/loop_position.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loops/boundary.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

class StepContext;


/// One of the module's optimizers under manual optimization (Lightning's LightningOptimizer):
/// step() goes through the strategy and precision (loss scaling, skipped steps) and counts toward
/// global_step, as every optimizer step does in Lightning.
class ManualOptimizer {
 public:
  ManualOptimizer(torch::optim::Optimizer& optimizer, std::size_t index, detail::ManualOptimizationLink& loop)
      : optimizer_(&optimizer), index_(index), loop_(&loop) {}

  /// Steps (calling on_before_optimizer_step first); false when the loss scaler skipped the step.
  bool step() { return loop_->manual_step(index_); }
  void zero_grad(bool set_to_none = true) { optimizer_->zero_grad(set_to_none); }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  std::size_t index() const { return index_; }

 private:
  torch::optim::Optimizer* optimizer_;
  std::size_t index_;
  detail::ManualOptimizationLink* loop_;
};

class StepContext {
 public:
  // ---- where the loop is ---------------------------------------------------------------------
  std::int64_t current_epoch = 0;
  std::int64_t global_step = 0;  ///< optimizer steps so far (skipped ones included, as Lightning counts)
  std::int64_t batch_idx = 0;
  int global_rank = 0;
  int world_size = 1;
  Stage stage = Stage::fit;
  bool sanity_checking = false;
  /// The evaluation loader under way when there are several (fit's validation, validate, test,
  /// predict given data::loaders(...)); none otherwise, as Lightning passes no dataloader_idx then.
  std::optional<std::int64_t> dataloader_idx{};
  /// Set it to end fit after this batch (Lightning's trainer.should_stop; min_epochs/min_steps
  /// are still honoured).
  bool should_stop = false;

  // ---- logging -------------------------------------------------------------------------------
  /// Records a metric (see LogOptions for on_step/on_epoch/reduce and their defaults per hook).
  void log(std::string_view name, const at::Tensor& value, const LogOptions& options = {}) {
    if (metrics_ == nullptr)
      throw MisconfigurationError("You can't `log(\"" + std::string(name) + "\")` here: no loop is running.");
    if (!options.add_dataloader_idx || !dataloader_idx) {
      if (options.add_dataloader_idx && name.find("/dataloader_idx_") != std::string_view::npos) raise_named_idx(name);
      metrics_->log(name, value, options);
      return;
    }
    if (name.find("/dataloader_idx_") != std::string_view::npos) raise_named_idx(name);
    dataloader_suffix_.assign("/dataloader_idx_");  // reused: no allocation once it is long enough
    dataloader_suffix_ += std::to_string(*dataloader_idx);
    metrics_->log(name, value, options, dataloader_suffix_);
  }
  void log(std::string_view name, double value, const LogOptions& options = {}) {
    log(name, at::scalar_tensor(value, at::kDouble), options);
  }

  // ---- manual optimization (automatic_optimization = false) ----------------------------------
  /// The optimizers configure_optimizers returned, in order.
  std::span<ManualOptimizer> optimizers() { return manual_optimizers(); }
  ManualOptimizer& optimizer(std::size_t index = 0) {
    auto all = manual_optimizers();
    if (index >= all.size())
      throw MisconfigurationError("optimizer(" + std::to_string(index) + "): configure_optimizers returned " +
                                  std::to_string(all.size()) + " optimizer(s).");
    return all[index];
  }
  /// The schedulers configure_optimizers returned (one per optimizer; empty ones where none was
  /// given). Under manual optimization you step them yourself, as in Lightning.
  std::span<AnyLRScheduler* const> lr_schedulers() const {
    require_manual("lr_schedulers");
    return schedulers_;
  }
  /// Backward through the strategy and precision (loss scaling, gradient sync), with the
  /// on_before_backward/on_after_backward hooks.
  void manual_backward(const at::Tensor& loss) {
    require_manual("manual_backward");
    manual_->manual_backward(loss);
  }
  /// Clips one optimizer's gradients (unscaling first); returns the total norm for max_norm.
  at::Tensor clip_gradients(ManualOptimizer& optimizer, const ClipGradients& clip) {
    require_manual("clip_gradients");
    return manual_->manual_clip(optimizer.index(), clip);
  }
  /// Only `optimizer`'s parameters require gradients until untoggle_optimizer (Lightning's
  /// toggle_optimizer: for alternating updates such as a GAN's generator and discriminator).
  void toggle_optimizer(ManualOptimizer& optimizer);
  void untoggle_optimizer(ManualOptimizer& optimizer);

  // ---- set by the loops ------------------------------------------------------------------------
  void attach(detail::MetricCollection* metrics) { metrics_ = metrics; }
  detail::MetricCollection* metrics() const { return metrics_; }
  /// Who runs now (a hook or step; `hook` views a string literal), for the logging rules and for
  /// the position a stuck rank is reported at (detail/loop_position.hpp).
  void enter(std::string_view hook, detail::LogScope scope) {
    detail::loop_position().enter(to_string(stage).data(), hook.data(), current_epoch, batch_idx);
    if (metrics_ != nullptr) metrics_->enter(hook, scope);
  }
  /// Manual optimization through `loop` (the loop under way, or a hand-written loop's stand-in).
  void attach_manual(detail::ManualOptimizationLink* loop, std::vector<ManualOptimizer> optimizers,
                     std::vector<AnyLRScheduler*> schedulers) {
    manual_ = loop;
    optimizers_ = std::move(optimizers);
    schedulers_ = std::move(schedulers);
  }

 private:
  std::span<ManualOptimizer> manual_optimizers() {
    require_manual("optimizers");
    return optimizers_;
  }
  void require_manual(const char* what) const {
    if (manual_ == nullptr)
      throw MisconfigurationError(std::string("StepContext::") + what +
                                  " is for manual optimization: declare `static constexpr bool automatic_optimization "
                                  "= false;` in your module, and fulgur leaves backward and the optimizer steps to you.");
  }

  /// Lightning's error for a name that already says which loader (with add_dataloader_idx).
  [[noreturn]] static void raise_named_idx(std::string_view name);

  detail::MetricCollection* metrics_ = nullptr;
  std::string dataloader_suffix_;  // "/dataloader_idx_<i>", reused from one log call to the next
  detail::ManualOptimizationLink* manual_ = nullptr;
  std::vector<ManualOptimizer> optimizers_;
  std::vector<AnyLRScheduler*> schedulers_;
  std::vector<std::pair<at::Tensor, bool>> toggled_;  // requires_grad to restore after untoggle
};

inline void StepContext::toggle_optimizer(ManualOptimizer& optimizer) {
  // Lightning: every parameter of the other optimizers stops requiring gradients; the toggled
  // optimizer's own parameters keep (or get back) their state.
  toggled_.clear();
  std::vector<const void*> own;
  for (auto& group : optimizer.optimizer().param_groups())
    for (auto& p : group.params()) own.push_back(p.unsafeGetTensorImpl());
  for (auto& other : manual_optimizers()) {
    if (other.index() == optimizer.index()) continue;
    for (auto& group : other.optimizer().param_groups())
      for (auto& p : group.params()) {
        if (std::find(own.begin(), own.end(), p.unsafeGetTensorImpl()) != own.end()) continue;
        toggled_.emplace_back(p, p.requires_grad());
        p.requires_grad_(false);
      }
  }
}

inline void StepContext::untoggle_optimizer(ManualOptimizer&) {
  for (auto& [p, requires_grad] : toggled_) p.requires_grad_(requires_grad);
  toggled_.clear();
}

}  // namespace fulgur
