#pragma once
// A small regression module and its data module, described for fulgur::cli: what the CLI's tests run.
#include <fulgur/cli.hpp>
#include <torch/torch.h>

#include <string_view>
#include <tuple>

namespace tiny {

namespace cli = fulgur::cli;

struct TinyConfig {
  std::int64_t hidden = 8;
  double lr = 0.05;
  static constexpr auto fields() {
    return std::tuple(cli::field("hidden", &TinyConfig::hidden, "hidden width"), cli::field("lr", &TinyConfig::lr, "SGD's lr"));
  }
};

struct TinyImpl : torch::nn::Module {
  using config_type = TinyConfig;
  explicit TinyImpl(TinyConfig c = {})
      : config(c), net(register_module("net", torch::nn::Sequential(torch::nn::Linear(4, c.hidden), torch::nn::Tanh(),
                                                                    torch::nn::Linear(c.hidden, 1)))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::mse_loss(net->forward(b.input), b.target);
  }
  at::Tensor validation_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::mse_loss(net->forward(b.input), b.target);
  }
  void test_step(const fulgur::data::Batch& b, std::int64_t, fulgur::StepContext& ctx) {
    ctx.log("test_mse", torch::mse_loss(net->forward(b.input), b.target));
  }
  at::Tensor predict_step(const fulgur::data::Batch& b, std::int64_t) { return net->forward(b.input); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(config.lr));
  }
  TinyConfig config;
  torch::nn::Sequential net;
};
TORCH_MODULE(Tiny);

struct TinyDataConfig {
  std::int64_t samples = 64;
  std::int64_t batch_size = 16;
  static constexpr auto fields() {
    return std::tuple(cli::field("samples", &TinyDataConfig::samples, "samples"),
                      cli::field("batch_size", &TinyDataConfig::batch_size, "batch size"));
  }
};

struct TinyData {
  using config_type = TinyDataConfig;
  explicit TinyData(TinyDataConfig c) : config(c) {}
  void setup(std::string_view) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
    x = at::randn({config.samples, 4}, gen);
    y = x.sum(1, true).sin();
  }
  fulgur::data::TensorLoader train_dataloader() const { return {x, y, {.batch_size = config.batch_size, .shuffle = true, .seed = 3}}; }
  fulgur::data::TensorLoader val_dataloader() const { return {x, y, {.batch_size = 32}}; }
  fulgur::data::TensorLoader test_dataloader() const { return val_dataloader(); }
  fulgur::data::TensorLoader predict_dataloader() const { return val_dataloader(); }
  TinyDataConfig config;
  at::Tensor x, y;
};

}  // namespace tiny
