// Several evaluation loaders with a module whose step or batch hook cannot tell them apart: exactly
// one error, Lightning's ("You provided multiple dataloaders, but no `dataloader_idx` argument"), also
// for predict, whose predictions are then used. The twin takes dataloader_idx.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

using Batch = fulgur::data::Batch;

struct Net : torch::nn::Module {
  at::Tensor training_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#if defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_STEP)
  at::Tensor validation_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#else
  at::Tensor validation_step(const Batch& b, std::int64_t, std::int64_t) { return fc(b.input).sum(); }
#endif
#if defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_BATCH_HOOK)
  void on_validation_batch_end(const at::Tensor&, const Batch&, std::int64_t) {}
#else
  void on_validation_batch_end(const at::Tensor&, const Batch&, std::int64_t, std::int64_t) {}
#endif
#if defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_PREDICT_STEP)
  at::Tensor predict_step(const Batch& b, std::int64_t) { return fc(b.input); }
#else
  at::Tensor predict_step(const Batch& b, std::int64_t, std::int64_t) { return fc(b.input); }
#endif
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};

void fit_with_two_validation_loaders() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader a(at::ones({4, 2}), at::ones({4})), b(at::ones({2, 2}), at::ones({2}));
  trainer.fit(net, a, {a, b});
  // The predictions used as a caller uses them (one vector per loader): the step stays the one error.
  std::int64_t rows = 0;
  for (const auto& per_loader : trainer.predict(net, {a, b}))
    for (const auto& p : per_loader) rows += p.size(0);
  (void)rows;
}
