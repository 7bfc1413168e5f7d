// fit refuses a module whose training_step is misspelt (train_step), naming what it needs.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
#ifdef FULGUR_COMPILE_FAIL
  at::Tensor train_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
#else
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
#endif
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc{2, 1};
};

void train() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
  trainer.fit(net, loader);
}
