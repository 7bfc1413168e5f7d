// Context "my_model": the reader's own module in docs/benchmarks.md's matrix program, `MyModel`
// (32 features, 10 classes, as the block's batches), declared before the program.
// @needs bench
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

struct MyModelImpl : torch::nn::Module {
  MyModelImpl() : fc(register_module("fc", torch::nn::Linear(32, 10))) {}
  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(batch.input), batch.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.01);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(MyModel);
// @block
