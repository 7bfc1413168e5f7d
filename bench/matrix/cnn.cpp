#include "../matrix.hpp"
#include "workloads.hpp"

namespace fulgur::bench {
namespace {
struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, 10))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    at::Tensor x = torch::max_pool2d(torch::relu(conv1(b.input)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return torch::nn::functional::cross_entropy(fc(x.flatten(1)), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::Adam>(parameters(), 1e-3);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);
}  // namespace

void register_cnn() {
  register_matrix("cnn", [] { return Cnn(); }, [] {
    torch::manual_seed(0);
    std::vector<data::Batch> batches;
    for (int i = 0; i < 20; ++i) batches.push_back({torch::randn({32, 3, 32, 32}), torch::randint(10, {32}, at::kLong)});
    return batches;
  }, {.items_per_batch = 32});
}
}  // namespace fulgur::bench
