// fit on a module that misses one requirement of fulgur::training_module: exactly one error, which
// names that requirement (concepts/training_module.hpp's table), not the list of all of them. The
// twin meets it.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <vector>

using Batch = fulgur::data::Batch;

#if defined(FULGUR_RULE_NOT_A_MODULE)
// The module forgot its base: a plain struct with the steps.
#ifdef FULGUR_COMPILE_FAIL
struct Net {
  at::Tensor training_step(const Batch& b, std::int64_t) { return b.input.sum(); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w}, 0.1);
  }
  at::Tensor w = at::ones({1});
};
#else
struct Net : torch::nn::Module {
  at::Tensor training_step(const Batch& b, std::int64_t) { return b.input.sum() * w; }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  at::Tensor w = register_parameter("w", at::ones({1}));
};
#endif
#elif defined(FULGUR_RULE_OTHER_BATCH)
// The loader yields std::vector<at::Tensor> batches; the step takes a fulgur::data::Batch.
struct Net : torch::nn::Module {
#ifdef FULGUR_COMPILE_FAIL
  at::Tensor training_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#else
  at::Tensor training_step(const std::vector<at::Tensor>& b, std::int64_t) { return fc(b.at(0)).sum(); }
#endif
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};
#elif defined(FULGUR_RULE_RUNTIME_AUTOMATIC_OPTIMIZATION)
// Manual optimization asked for with a data member: fulgur picks the loop at compile time.
struct Net : torch::nn::Module {
#ifdef FULGUR_COMPILE_FAIL
  bool automatic_optimization = false;
#else
  static constexpr bool automatic_optimization = false;
#endif
  void training_step(const Batch& b, std::int64_t, fulgur::StepContext& ctx) { ctx.manual_backward(fc(b.input).sum()); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};
#elif defined(FULGUR_RULE_VOID_TRAINING_STEP)
// Under automatic optimization the step must hand back its loss.
struct Net : torch::nn::Module {
#ifdef FULGUR_COMPILE_FAIL
  void training_step(const Batch& b, std::int64_t) { last = fc(b.input).sum(); }
#else
  at::Tensor training_step(const Batch& b, std::int64_t) { return last = fc(b.input).sum(); }
#endif
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
  at::Tensor last;
};
#elif defined(FULGUR_RULE_NO_CONFIGURE_OPTIMIZERS)
// The optimizer is made outside the module: fit has none to use.
struct Net : torch::nn::Module {
  at::Tensor training_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#ifndef FULGUR_COMPILE_FAIL
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
#endif
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};
#elif defined(FULGUR_RULE_BAD_CONFIGURE_OPTIMIZERS)
// configure_optimizers hands out a raw pointer: who owns it?
struct Net : torch::nn::Module {
  at::Tensor training_step(const Batch& b, std::int64_t) { return fc(b.input).sum(); }
#ifdef FULGUR_COMPILE_FAIL
  torch::optim::Optimizer* configure_optimizers() { return new torch::optim::SGD(parameters(), 0.1); }
#else
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
#endif
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(2, 1));
};
#else
#error "define one FULGUR_RULE_*"
#endif

void train() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
#if defined(FULGUR_RULE_OTHER_BATCH)
  std::vector<std::vector<at::Tensor>> loader{{at::ones({4, 2})}};
#else
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
#endif
  trainer.fit(net, loader);
}
