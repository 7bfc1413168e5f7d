// A callback hook that no form can call (an `int` where Lightning passes nothing) is one error
// naming the hook, not a hook silently never called.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct EpochPrinter {
#ifdef FULGUR_COMPILE_FAIL
  void on_train_epoch_end(fulgur::TrainerView& trainer, int epochs) { trainer.print(std::to_string(epochs)); }
#else
  void on_train_epoch_end(fulgur::TrainerView& trainer) { trainer.print("epoch done"); }
#endif
};

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc{2, 1};
};

void train() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, EpochPrinter> trainer;
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
  trainer.fit(net, loader);
}
