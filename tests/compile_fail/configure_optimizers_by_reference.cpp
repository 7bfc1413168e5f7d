// fit refuses a configure_optimizers that returns a reference to the module's own optimizer
// (moving it out would leave the module's member empty behind the user's back): one error, which
// says to return it by value. The twin returns it by value.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
#ifdef FULGUR_COMPILE_FAIL
  std::vector<fulgur::OptimizerConfig>& configure_optimizers() {
    configs.push_back({std::make_unique<torch::optim::SGD>(parameters(), 0.1)});
    return configs;
  }
  std::vector<fulgur::OptimizerConfig> configs;
#else
  std::vector<fulgur::OptimizerConfig> configure_optimizers() {
    std::vector<fulgur::OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::SGD>(parameters(), 0.1)});
    return configs;
  }
#endif
  torch::nn::Linear fc{2, 1};
};

void train() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
  trainer.fit(net, loader);
}
