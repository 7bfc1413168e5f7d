// Trains a classifier on scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), as a
// fulgur::cli program: LightningCLI's interface, built once and run many ways (docs/cli.md).
//
//   digits_classifier fit --config examples/digits.yaml          train (validation on a held-out fifth)
//   digits_classifier fit --trainer.precision=bf16-mixed --model.lr=1e-3 --trainer.max_epochs=20
//   digits_classifier fit --print_config > run.yaml              the resolved config; `--config run.yaml` reruns it
//   digits_classifier test --ckpt_path=checkpoints/last.ckpt     test accuracy of a checkpoint's weights
//   digits_classifier fit --help                                 every key with its type, default and doc
//
// The single-device Trainer types (cpu or cuda, six precisions) are compiled; --trainer.accelerator and
// --trainer.precision pick one at run time. Expect about 97-98% accuracy.
#include <fulgur/cli.hpp>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

/// The model's hyper-parameters: what `--model.KEY` sets.
struct DigitsConfig {
  std::int64_t hidden = 128;
  double lr = 2e-3;
  double plateau_factor = 0.3;
  std::int64_t plateau_patience = 3;
  static constexpr auto fields() {
    using fulgur::cli::field;
    return std::tuple(field("hidden", &DigitsConfig::hidden, "width of the first hidden layer"),
                      field("lr", &DigitsConfig::lr, "Adam's learning rate"),
                      field("plateau_factor", &DigitsConfig::plateau_factor, "ReduceLROnPlateau's factor on val_loss"),
                      field("plateau_patience", &DigitsConfig::plateau_patience, "epochs without improvement before it"));
  }
};

struct DigitsNetImpl : torch::nn::Module {
  using config_type = DigitsConfig;
  explicit DigitsNetImpl(DigitsConfig config = {})
      : config(config),
        net(register_module("net", torch::nn::Sequential(torch::nn::Linear(64, config.hidden), torch::nn::ReLU(),
                                                         torch::nn::Linear(config.hidden, 64), torch::nn::ReLU(),
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
    auto adam = std::make_unique<torch::optim::Adam>(parameters(), config.lr);
    auto plateau = std::make_unique<fulgur::optim::ReduceLROnPlateau>(
        *adam, fulgur::optim::ReduceLROnPlateauOptions{.factor = config.plateau_factor, .patience = config.plateau_patience});
    return {.optimizer = std::move(adam), .lr_scheduler = std::move(plateau), .monitor = "val_loss"};
  }
  static at::Tensor accuracy(const at::Tensor& logits, const at::Tensor& target) {
    return logits.argmax(1).eq(target).to(at::kFloat).mean();
  }
  DigitsConfig config;
  torch::nn::Sequential net;
};
TORCH_MODULE(DigitsNet);

/// The data module's settings: what `--data.KEY` sets.
struct DigitsDataConfig {
  std::string path = "data/digits.csv";
  std::int64_t batch_size = 64;
  double held_out = 0.2;
  std::uint64_t split_seed = 0;
  static constexpr auto fields() {
    using fulgur::cli::field;
    using C = DigitsDataConfig;
    return std::tuple(field("path", &C::path, "the CSV: 64 pixel values (0-16) then the label, per line "
                                              "(python scripts/export_digits.py PATH writes it)"),
                      field("batch_size", &C::batch_size, "training batch size"),
                      field("held_out", &C::held_out, "fraction of the images kept for validation, test and predict"),
                      field("split_seed", &C::split_seed, "seed of the train / held-out split"));
  }
};

/// Lightning's LightningDataModule: reads the CSV at setup, gives the loaders.
class DigitsData {
 public:
  using config_type = DigitsDataConfig;
  explicit DigitsData(DigitsDataConfig config) : config_(std::move(config)) {}

  void setup(std::string_view) {
    std::ifstream in(config_.path);
    if (!in)
      throw std::runtime_error("cannot open " + config_.path + " (make it with: python scripts/export_digits.py " +
                               config_.path + ", or set --data.path)");
    std::vector<float> pixels;
    std::vector<std::int64_t> labels;
    for (std::string line; std::getline(in, line);) {
      std::stringstream fields(line);
      std::vector<float> row;
      for (std::string value; std::getline(fields, value, ',');) row.push_back(std::stof(value));
      if (row.size() != 65)
        throw std::runtime_error(config_.path + ": expected 65 values per line, got " + std::to_string(row.size()));
      pixels.insert(pixels.end(), row.begin(), row.end() - 1);
      labels.push_back(static_cast<std::int64_t>(row.back()));
    }
    const auto n = static_cast<std::int64_t>(labels.size());
    const at::Tensor images = torch::tensor(pixels).reshape({n, 64}) / 16.0, targets = torch::tensor(labels);
    const auto held = static_cast<std::int64_t>(static_cast<double>(n) * config_.held_out);
    if (held < 1 || held >= n) throw std::runtime_error("data.held_out leaves no training or no held-out images");
    at::Generator split = at::make_generator<at::CPUGeneratorImpl>(config_.split_seed);
    const at::Tensor order = at::randperm(n, split, at::TensorOptions().dtype(at::kLong));
    held_ = {images.index_select(0, order.narrow(0, 0, held)), targets.index_select(0, order.narrow(0, 0, held))};
    train_ = {images.index_select(0, order.narrow(0, held, n - held)), targets.index_select(0, order.narrow(0, held, n - held))};
  }
  fulgur::data::TensorLoader train_dataloader() const {
    return {train_.first, train_.second, {.batch_size = config_.batch_size, .shuffle = true, .seed = 1}};
  }
  fulgur::data::TensorLoader val_dataloader() const { return {held_.first, held_.second, {.batch_size = 512}}; }
  fulgur::data::TensorLoader test_dataloader() const { return val_dataloader(); }
  fulgur::data::TensorLoader predict_dataloader() const { return val_dataloader(); }

 private:
  DigitsDataConfig config_;
  std::pair<at::Tensor, at::Tensor> train_, held_;
};

int main(int argc, char** argv) {
  // The single-device combinations only: this program never runs the others, so it never compiles them.
  constexpr auto single_device = fulgur::compatible_trainers(
      fulgur::shipped_accelerators, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>, fulgur::shipped_precisions);
  return fulgur::cli::main<DigitsNet, DigitsData>(argc, argv, single_device, fulgur::cli::shipped_classes{},
                                                  {.description = "An MLP on scikit-learn's 8x8 digits."});
}
