// validate, test and predict on a module without the step they run: exactly one error, which names
// the call and the step it needs ("test() needs test_step(batch, batch_idx)"), not "validation_step/
// test_step", and not a second one where the predictions are used. The twin has the step.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

using Batch = fulgur::data::Batch;

struct Net : torch::nn::Module {
  at::Tensor training_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#if !defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_VALIDATE)
  at::Tensor validation_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#endif
#if !defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_TEST)
  at::Tensor test_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#endif
#if !defined(FULGUR_COMPILE_FAIL) && defined(FULGUR_RULE_PREDICT)
  at::Tensor predict_step(const Batch& b, std::int64_t) { return fc(b.input); }
#endif
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};

void evaluate() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
#if defined(FULGUR_RULE_VALIDATE)
  trainer.validate(net, loader);
#elif defined(FULGUR_RULE_TEST)
  trainer.test(net, loader);
#elif defined(FULGUR_RULE_PREDICT)
  // Used as a caller uses them: the missing step stays the one error.
  auto predictions = trainer.predict(net, loader);
  std::int64_t rows = 0;
  for (const auto& p : predictions) rows += p.size(0);
  (void)(rows + static_cast<std::int64_t>(predictions.size()) + predictions.at(0).argmax(1).numel());
#else
#error "define one FULGUR_RULE_*"
#endif
}
