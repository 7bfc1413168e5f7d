// Manual optimization with two optimizers: a small GAN learns to draw points from a 2-D Gaussian
// centred at (2, -1) with standard deviation 0.5. The module steps its optimizers itself
// (Lightning's automatic_optimization = False): fulgur still does the precision's work (loss
// scaling under '16-mixed', autocast) in manual_backward and step(), and counts every step.
// It exits 1 unless the generated points are centred where the data is (within 0.3) and spread
// (a standard deviation between 0.2 and 1 in each coordinate: not collapsed to a point).
//
//   gan [--precision 32-true|bf16-mixed|16-mixed] [--epochs N]
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>

struct GanImpl : torch::nn::Module {
  static constexpr bool automatic_optimization = false;

  GanImpl()
      : generator(register_module("generator", torch::nn::Sequential(torch::nn::Linear(4, 32), torch::nn::LeakyReLU(),
                                                                      torch::nn::Linear(32, 2)))),
        discriminator(register_module("discriminator",
                                      torch::nn::Sequential(torch::nn::Linear(2, 32), torch::nn::LeakyReLU(),
                                                            torch::nn::Linear(32, 1)))) {}

  at::Tensor sample(std::int64_t n) { return generator->forward(torch::randn({n, 4})); }

  void training_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    auto& d_optimizer = ctx.optimizer(0);
    auto& g_optimizer = ctx.optimizer(1);
    const std::int64_t n = batch.input.size(0);

    // The discriminator: real points are 1, generated ones 0.
    ctx.toggle_optimizer(d_optimizer);
    const auto d_loss = bce(discriminator->forward(batch.input), 1.0) + bce(discriminator->forward(sample(n).detach()), 0.0);
    d_optimizer.zero_grad();
    ctx.manual_backward(d_loss);
    d_optimizer.step();
    ctx.untoggle_optimizer(d_optimizer);

    // The generator: make the discriminator say 1.
    ctx.toggle_optimizer(g_optimizer);
    const auto g_loss = bce(discriminator->forward(sample(n)), 1.0);
    g_optimizer.zero_grad();
    ctx.manual_backward(g_loss);
    g_optimizer.step();
    ctx.untoggle_optimizer(g_optimizer);

    ctx.log("d_loss", d_loss, {.prog_bar = true});
    ctx.log("g_loss", g_loss, {.prog_bar = true});
  }

  std::vector<fulgur::OptimizerConfig> configure_optimizers() {
    const auto adam = [this](std::vector<at::Tensor> parameters) {
      return std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions(lr).betas({0.5, 0.999}));
    };
    std::vector<fulgur::OptimizerConfig> optimizers;
    optimizers.push_back({adam(discriminator->parameters())});
    optimizers.push_back({adam(generator->parameters())});
    return optimizers;
  }

  static at::Tensor bce(const at::Tensor& logits, double target) {
    return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
  }

  torch::nn::Sequential generator, discriminator;
  double lr = 2e-3;
};
TORCH_MODULE(Gan);

template <class Trainer>
int train(std::int64_t epochs, double lr) {
  Trainer trainer({.max_epochs = epochs, .seed = 0, .enable_progress_bar = false});
  trainer.print("fulgur: a GAN on ", trainer.combination_name());
  const auto real = torch::randn({2048, 2}) * 0.5 + torch::tensor({2.0f, -1.0f});
  fulgur::data::TensorLoader data(real, torch::zeros({2048}), {.batch_size = 128, .shuffle = true});
  Gan gan;
  gan->lr = lr;
  const auto result = trainer.fit(gan, data);
  torch::NoGradGuard no_grad;
  const auto points = gan->sample(4096);
  const auto mean = points.mean(0), spread = points.std(0);
  std::printf("optimizer steps %lld (two per batch); generated mean (%.3f, %.3f), std (%.3f, %.3f); data: (2, -1), 0.5\n",
              static_cast<long long>(result.global_step), mean[0].item<double>(), mean[1].item<double>(),
              spread[0].item<double>(), spread[1].item<double>());
  const bool learnt = (mean - torch::tensor({2.0f, -1.0f})).abs().max().item<double>() < 0.3 &&
                      spread.min().item<double>() > 0.2 && spread.max().item<double>() < 1.0;
  return learnt ? 0 : 1;
}

int main(int argc, char** argv) {
  std::string precision = "32-true";
  std::int64_t epochs = 100;
  double lr = 2e-3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--precision") precision = argv[i + 1];
    if (arg == "--epochs") epochs = std::stoll(argv[i + 1]);
    if (arg == "--lr") lr = std::stod(argv[i + 1]);
  }
  constexpr auto cpu = fulgur::compatible_trainers(boost::hana::tuple_t<fulgur::CPUAccelerator>,
                                                   boost::hana::tuple_t<fulgur::SingleDeviceStrategy>,
                                                   boost::hana::tuple_t<fulgur::FloatPrecision, fulgur::BF16MixedPrecision,
                                                                        fulgur::FP16MixedPrecision>);
  return fulgur::dispatch("cpu", "single_device", precision,
                          [&](auto trainer_type) { return train<typename decltype(trainer_type)::type>(epochs, lr); }, cpu);
}
