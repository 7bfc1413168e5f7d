#pragma once
// Linear - BatchNorm1d - ReLU - Linear: a module with parameters and buffers (an integer one too),
// shared by the weight-averaging tests of one process and of two ranks.
#include <torch/torch.h>

#include <fulgur/data/batch.hpp>
#include <fulgur/step_context.hpp>

#include <cstdint>
#include <memory>

namespace test {

struct BatchNormNetImpl : torch::nn::Module {
  BatchNormNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        bn(register_module("bn", torch::nn::BatchNorm1d(16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  at::Tensor validation_step(const fulgur::data::Batch& b, std::int64_t, fulgur::StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input), b.target);
    ctx.log("val_loss", loss);
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(BatchNormNet);

}  // namespace test
