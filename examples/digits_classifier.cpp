// Trains a classifier on scikit-learn's 8x8 handwritten digits (1797 images, 10 classes): fit with
// validation (accuracy on the progress bar, the learning rate cut by ReduceLROnPlateau when
// val_loss stalls, EarlyStopping when it stops improving), logs to metrics.csv and a TensorBoard
// event file under logs/lightning_logs/version_N, then tests on a held-out fifth and predicts a few
// digits. Expect about 97-98% test accuracy; it exits 1 below 95%.
//
//   digits_classifier data/digits.csv [--accelerator cpu|cuda] [--precision 32-true|64-true|16-mixed|bf16-mixed|bf16-true]
//                     [--epochs N]
// The strings pick one of the compiled single-device Trainer types (fulgur::dispatch): only the
// combinations this program can run are compiled.
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

  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    auto loss = torch::nn::functional::cross_entropy(forward(batch.input), batch.target);
    ctx.log("train_loss", loss, {.on_epoch = true});
    return loss;
  }
  /// The loss (fulgur reports it as val_loss) and the accuracy, logged as an epoch mean.
  at::Tensor validation_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    const auto logits = forward(batch.input);
    ctx.log("val_acc", accuracy(logits, batch.target), {.prog_bar = true});
    return torch::nn::functional::cross_entropy(logits, batch.target);
  }
  void test_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    ctx.log("test_acc", accuracy(forward(batch.input), batch.target));
  }
  at::Tensor predict_step(const fulgur::data::Batch& batch, std::int64_t) { return forward(batch.input).argmax(1); }
  fulgur::OptimizerConfig configure_optimizers() {
    auto adam = std::make_unique<torch::optim::Adam>(parameters(), 2e-3);
    auto plateau = std::make_unique<fulgur::optim::ReduceLROnPlateau>(*adam, fulgur::optim::ReduceLROnPlateauOptions{
                                                                                 .factor = 0.3, .patience = 3});
    return {.optimizer = std::move(adam), .lr_scheduler = std::move(plateau), .monitor = "val_loss"};
  }
  /// What the loggers record as the run's hyper-parameters (hparams.yaml, TensorBoard's HPARAMS tab).
  fulgur::Hyperparameters hparams() const {
    return {{"lr", 2e-3}, {"hidden", std::int64_t{128}}, {"batch_size", std::int64_t{64}}, {"optimizer", std::string("adam")}};
  }
  static at::Tensor accuracy(const at::Tensor& logits, const at::Tensor& target) {
    return logits.argmax(1).eq(target).to(at::kFloat).mean();
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

template <class Combination>
double train_and_test(const at::Tensor& images, const at::Tensor& labels, std::int64_t epochs) {
  // The combination dispatch chose, with the callbacks and loggers of this run.
  using Trainer = typename Combination::template with_callbacks<fulgur::EarlyStopping, fulgur::LearningRateMonitor,
                                                                fulgur::CSVLogger, fulgur::TensorBoardLogger>;
  Trainer trainer({.max_epochs = epochs, .seed = 0, .default_root_dir = "logs"},
                  fulgur::EarlyStopping({.monitor = "val_loss", .min_delta = 1e-4, .patience = 8}),
                  fulgur::LearningRateMonitor(), fulgur::CSVLogger(), fulgur::TensorBoardLogger());
  trainer.print("fulgur: training on ", trainer.combination_name());

  const auto order = torch::randperm(images.size(0), at::TensorOptions().dtype(at::kLong));
  const std::int64_t n_test = images.size(0) / 5;
  const auto test_ids = order.narrow(0, 0, n_test), train_ids = order.narrow(0, n_test, images.size(0) - n_test);
  const auto test_images = images.index_select(0, test_ids), test_labels = labels.index_select(0, test_ids);
  fulgur::data::TensorLoader train(images.index_select(0, train_ids), labels.index_select(0, train_ids),
                                   {.batch_size = 64, .shuffle = true, .seed = 1});
  fulgur::data::TensorLoader test(test_images, test_labels, {.batch_size = 512});

  DigitsNet model;
  const fulgur::FitResult fit = trainer.fit(model, train, test);
  trainer.print("fit stopped: ", fit.stop_reason, "; val_acc ", fit.metrics.at("val_acc"));
  trainer.print("logs: ", trainer.template callback<fulgur::CSVLogger>().metrics_file(), " and ",
                trainer.template callback<fulgur::TensorBoardLogger>().log_dir(),
                " (tensorboard --logdir logs)");
  const double accuracy = trainer.test(model, test).metrics.at("test_acc");

  const std::vector<at::Tensor> predicted = trainer.predict(model, test);  // one tensor per batch, on the CPU
  auto digits = [](const at::Tensor& t) {
    std::string text;
    for (std::int64_t i = 0; i < 16; ++i) text += std::to_string(t[i].template item<std::int64_t>());
    return text;
  };
  trainer.print("the first test digits: ", digits(test_labels), "\n            predicted: ", digits(predicted.front()));
  return accuracy;
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
    // The single-device combinations only: this program never runs the others, so it never compiles them.
    constexpr auto single_device = fulgur::compatible_trainers(
        fulgur::shipped_accelerators, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>, fulgur::shipped_precisions);
    accuracy = fulgur::dispatch(
        accelerator, "single_device", precision,
        [&](auto trainer_type) { return train_and_test<typename decltype(trainer_type)::type>(images, labels, epochs); },
        single_device);
  } catch (const fulgur::MisconfigurationError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  std::printf("test accuracy %.4f (%s)\n", accuracy, precision.c_str());
  return accuracy >= 0.95 ? 0 : 1;
}
