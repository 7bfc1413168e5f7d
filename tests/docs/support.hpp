#pragma once
// What the contexts of the docs' fragments share (tests/docs/contexts/): declared once for the one
// translation unit of all fragments, so that blocks training the same module with the same Trainer
// instantiate its loops once.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

namespace docs_support {

/// A classifier of 8 features into 3 classes with every step: what a doc calls `model` or `Net`.
struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(batch.input), batch.target);
  }
  at::Tensor validation_step(const fulgur::data::Batch& batch, std::int64_t i) { return training_step(batch, i); }
  at::Tensor test_step(const fulgur::data::Batch& batch, std::int64_t i) { return training_step(batch, i); }
  at::Tensor predict_step(const fulgur::data::Batch& batch, std::int64_t) { return forward(batch.input); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

inline at::Tensor inputs() { return torch::randn({32, 8}); }
inline at::Tensor targets() { return torch::randint(3, {32}, at::kLong); }
inline fulgur::data::TensorLoader loader() { return fulgur::data::TensorLoader(inputs(), targets(), {.batch_size = 8}); }

}  // namespace docs_support
