// A fit with the real Trainer logging to MLflow: a tiny MLP, its hyper-parameters, a ModelCheckpoint
// (in the logger's run folder, as Lightning lays it out) whose kept files log_model uploads.
//   fulgur_mlflow_fit TRACKING_URI OUT_DIR
// Writes OUT_DIR/report.txt (run id, the checkpoints kept, warnings); check_mlflow.py reads the run back.
#include <fulgur/fulgur.hpp>
#include <fulgur/loggers/mlflow_logger.hpp>
#include <torch/torch.h>

#include <fstream>
#include <iostream>

struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t, fulgur::StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input), b.target);
    ctx.log("train_loss", loss);
    return loss;
  }
  at::Tensor validation_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  fulgur::Hyperparameters hparams() const {
    return {{"lr", 0.1}, {"hidden", std::int64_t{16}}, {"optimizer", std::string("sgd")}};
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fulgur_mlflow_fit TRACKING_URI OUT_DIR\n";
    return 2;
  }
  const std::string uri = argv[1], out = argv[2];
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({256, 8}), y = x.sum(1).gt(0).to(at::kLong);
  fulgur::data::TensorLoader train(x.slice(0, 0, 192), y.slice(0, 0, 192), {.batch_size = 16});
  fulgur::data::TensorLoader val(x.slice(0, 192), y.slice(0, 192), {.batch_size = 64});
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, fulgur::MLFlowLogger,
                  fulgur::ModelCheckpoint>
      trainer({.max_epochs = 3, .log_every_n_steps = 4, .default_root_dir = out, .enable_progress_bar = false},
              fulgur::MLFlowLogger({.experiment_name = "fulgur-fit", .run_name = "mlp", .tracking_uri = uri,
                                    .log_model = fulgur::MLFlowLogModel::at_end}),
              fulgur::ModelCheckpoint({.monitor = "val_loss", .save_top_k = 2}));
  Mlp model;
  const fulgur::FitResult result = trainer.fit(model, train, val);
  const auto& logger = trainer.callback<fulgur::MLFlowLogger>();
  const auto& checkpoint = trainer.callback<fulgur::ModelCheckpoint>();
  std::ofstream report(out + "/report.txt");
  report << "run_id=" << logger.version() << "\nlog_dir=" << logger.log_dir() << "\nglobal_step=" << result.global_step
         << "\nbest=" << checkpoint.best_model_path() << "\n";
  for (const auto& [path, score] : checkpoint.best_k_models()) report << "kept=" << path << "\n";
  for (const std::string& warning : result.warnings) report << "warning=" << warning << "\n";
  std::cout << "fit done: " << result.global_step << " steps, run " << logger.version() << "\n";
}
