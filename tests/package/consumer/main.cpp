// A project outside fulgur that uses it as a package: trains a tiny regression and prints the loss.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <iostream>

struct Line : torch::nn::Module {
  Line() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::mse_loss(fc(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc{1, 1};
};

int main() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer(
      {.max_epochs = 20, .seed = 0, .enable_progress_bar = false});
  auto x = at::linspace(-1, 1, 64).unsqueeze(1);
  fulgur::data::TensorLoader loader(x, 3 * x + 1, {.batch_size = 16, .shuffle = true});
  auto model = std::make_shared<Line>();
  const auto result = trainer.fit(model, loader);
  const double first = result.epochs.front().train_loss.value(), last = result.epochs.back().train_loss.value();
  std::cout << "consumer trained: loss " << first << " -> " << last << "\n";
  return last < 0.01 ? 0 : 1;
}
