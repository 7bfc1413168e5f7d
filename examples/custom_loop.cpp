// Your own loop on fulgur's Fabric-level verbs: fit y = sin(3x) with an MLP under '16-mixed'
// (fp16 autocast + loss scaling, on CPU here, on CUDA with CUDAAccelerator).
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <cstdio>

int main() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FP16MixedPrecision> trainer(
      {.seed = 0});

  auto model = [&] {
    auto ctx = trainer.init_module();  // on the root device, in the precision's dtype
    return torch::nn::Sequential(torch::nn::Linear(1, 64), torch::nn::Tanh(), torch::nn::Linear(64, 64),
                                 torch::nn::Tanh(), torch::nn::Linear(64, 1));
  }();
  torch::optim::Adam optimizer(model->parameters(), 1e-2);
  trainer.setup(model, optimizer);

  const auto x = torch::linspace(-1, 1, 512).unsqueeze(1);
  auto loader = trainer.setup_dataloader(fulgur::data::TensorLoader(x, torch::sin(3 * x), {.batch_size = 64, .shuffle = true}));

  double loss_value = 0;
  int skipped = 0;
  for (int epoch = 0; epoch < 150; ++epoch) {
    for (const auto& batch : loader) {
      const auto b = trainer.batch_to_device(batch);
      at::Tensor loss;
      {
        auto autocast = trainer.forward_context();
        loss = torch::mse_loss(model->forward(b.input), b.target);
      }
      trainer.backward(loss);                                       // scaled by the GradScaler
      trainer.clip_gradients(model, optimizer, {.max_norm = 1.0});  // unscales first
      if (!trainer.optimizer_step(optimizer)) ++skipped;            // false: inf/NaN gradients, step skipped
      optimizer.zero_grad();
      loss_value = loss.item<double>();
    }
    if (epoch % 50 == 0) trainer.print("epoch ", epoch, "  loss ", loss_value, "  scale ", trainer.precision().scaler().get_scale());
  }
  std::printf("final loss %.5f (%d steps skipped by the loss scaler)\n", loss_value, skipped);
  return loss_value < 0.01 ? 0 : 1;
}
