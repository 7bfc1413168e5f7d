// Trains a classifier on scikit-learn's 8x8 handwritten digits (1797 images, 10 classes) and
// reports its accuracy on a held-out fifth. Expect about 97-98%; it exits 1 below 95%.
//
//   digits_classifier data/digits.csv [--accelerator cpu|cuda] [--precision 32-true|64-true|16-mixed|bf16-mixed|bf16-true]
//                     [--epochs N]
// The strings pick one of the compiled Trainer types (fulgur::dispatch).
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

struct DigitsNetImpl : torch::nn::Module {
  DigitsNetImpl()
      : net(register_module("net", torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                                                         torch::nn::Linear(128, 64), torch::nn::ReLU(),
                                                         torch::nn::Linear(64, 10)))) {}
  at::Tensor forward(const at::Tensor& x) { return net->forward(x); }

  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(batch.input), batch.target);
  }
  at::Tensor validation_step(const fulgur::data::Batch& batch, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(batch.input), batch.target);
  }
  fulgur::OptimizerConfig configure_optimizers() {
    auto adam = std::make_unique<torch::optim::Adam>(parameters(), 2e-3);
    auto schedule = std::make_unique<torch::optim::StepLR>(*adam, /*step_size=*/20, /*gamma=*/0.3);
    return {std::move(adam), std::move(schedule), fulgur::SchedulerInterval::epoch};
  }
  torch::nn::Sequential net;
};
TORCH_MODULE(DigitsNet);

// 64 pixel values (0-16) then the label, one image per line.
std::pair<at::Tensor, at::Tensor> read_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + " (make it with: python scripts/export_digits.py " + path + ")");
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  for (std::string line; std::getline(in, line);) {
    std::stringstream fields(line);
    std::string value;
    std::vector<float> row;
    while (std::getline(fields, value, ',')) row.push_back(std::stof(value));
    if (row.size() != 65) throw std::runtime_error(path + ": expected 65 values per line, got " + std::to_string(row.size()));
    pixels.insert(pixels.end(), row.begin(), row.end() - 1);
    labels.push_back(static_cast<std::int64_t>(row.back()));
  }
  const auto n = static_cast<std::int64_t>(labels.size());
  return {torch::tensor(pixels).reshape({n, 64}) / 16.0, torch::tensor(labels)};
}

template <class Trainer>
double train_and_test(const at::Tensor& images, const at::Tensor& labels, std::int64_t epochs) {
  Trainer trainer({.max_epochs = epochs, .seed = 0});
  trainer.print("fulgur: training on ", trainer.combination_name());

  const auto order = torch::randperm(images.size(0), at::TensorOptions().dtype(at::kLong));
  const std::int64_t n_test = images.size(0) / 5;
  const auto test_ids = order.narrow(0, 0, n_test), train_ids = order.narrow(0, n_test, images.size(0) - n_test);
  fulgur::data::TensorLoader train(images.index_select(0, train_ids), labels.index_select(0, train_ids),
                                   {.batch_size = 64, .shuffle = true, .seed = 1});
  fulgur::data::TensorLoader test(images.index_select(0, test_ids), labels.index_select(0, test_ids), {.batch_size = 512});

  DigitsNet model;
  trainer.fit(model, train, test);

  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0;
  for (const auto& batch : test) {
    at::Tensor logits;
    {
      auto ctx = trainer.forward_context();
      logits = model->forward(trainer.convert_input(batch.input));
    }
    correct += logits.argmax(1).eq(batch.target).sum().template item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n_test);
}

int main(int argc, char** argv) {
  std::string path = "data/digits.csv", accelerator = "cpu", precision = "32-true";
  std::int64_t epochs = 40;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (arg == "--accelerator" && i + 1 < argc) accelerator = argv[++i];
    else if (arg == "--epochs" && i + 1 < argc) epochs = std::stoll(argv[++i]);
    else path = arg;
  }
  const auto [images, labels] = read_digits(path);
  std::cout << "digits: " << images.size(0) << " images of 8x8 pixels, 10 classes\n";

  double accuracy = 0;
  try {
    accuracy = fulgur::dispatch(accelerator, "single_device", precision, [&](auto trainer_type) {
      return train_and_test<typename decltype(trainer_type)::type>(images, labels, epochs);
    });
  } catch (const fulgur::MisconfigurationError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  std::printf("test accuracy %.4f (%s)\n", accuracy, precision.c_str());
  return accuracy >= 0.95 ? 0 : 1;
}
