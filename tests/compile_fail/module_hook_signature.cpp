// A module hook with Lightning's name but a signature fulgur cannot call is an error naming the
// hook (it would otherwise never run). Twin: Lightning's signature.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
#ifdef FULGUR_COMPILE_FAIL
  void on_train_batch_end(int step) { last = step; }  // Lightning's is (outputs, batch, batch_idx)
#else
  void on_train_batch_end(const at::Tensor&, const fulgur::data::Batch&, std::int64_t step) { last = step; }
#endif
  torch::nn::Linear fc{2, 1};
  std::int64_t last = 0;
};

void train() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto net = std::make_shared<Net>();
  trainer.fit(net, fulgur::data::TensorLoader(at::ones({4, 2}), at::ones({4})));
}
