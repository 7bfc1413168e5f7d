// fulgur::cli end to end: a program's module and data module run from a command line, the run-time
// choice reaching each compiled Trainer type, callbacks and loggers built from the config, the resolved
// config saved beside the logs and in checkpoints, print -> run -> print, and the errors of the
// run-time choice.
#include <catch2/catch.hpp>
#include <fulgur/cli.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/tiny.hpp"
#include "unit/support.hpp"

namespace cli = fulgur::cli;
namespace hana = boost::hana;

namespace {

using tiny::Tiny, tiny::TinyData;
using fulgur::BF16MixedPrecision, fulgur::DoublePrecision, fulgur::FloatPrecision, fulgur::CPUAccelerator,
    fulgur::SingleDeviceStrategy, fulgur::DDPStrategy, fulgur::Trainer;
constexpr auto compiled = hana::tuple_t<Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision>,
                                        Trainer<CPUAccelerator, SingleDeviceStrategy, BF16MixedPrecision>,
                                        Trainer<CPUAccelerator, SingleDeviceStrategy, DoublePrecision>,
                                        Trainer<CPUAccelerator, DDPStrategy, FloatPrecision>>;

cli::Outcome run(std::vector<std::string> args) {
  args.insert(args.begin(), "tiny");
  return cli::run<Tiny, TinyData>(args, compiled);
}

/// Quiet, short, and in its own folder.
std::vector<std::string> base(const std::string& subcommand, const std::string& dir) {
  return {subcommand, "--trainer.default_root_dir=" + dir, "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", "--seed_everything=5"};
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// cli::main on `fit`, quiet, in `dir`, with `extra`: its exit code and what it printed on stderr.
std::pair<int, std::string> main_fit(const std::string& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args = base("fit", dir);
  args.insert(args.begin(), "tiny");
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  std::ostringstream captured;
  std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
  const int code = cli::main<Tiny, TinyData>(static_cast<int>(argv.size()), argv.data(), compiled);
  std::cerr.rdbuf(original);
  return {code, captured.str()};
}

template <class F>
std::string config_error(F&& f) {
  return test::message_of<fulgur::MisconfigurationError>(std::forward<F>(f));
}

}  // namespace

TEST_CASE("cli run: the strings reach each compiled combination", "[cli]") {
  const std::string dir = test::scratch_folder("cli_combinations");
  for (const auto& [strategy, precision, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"single_device", "32-true", "cpu/single_device/32-true"},
           {"single_device", "bf16", "cpu/single_device/bf16-mixed"},
           {"SingleDeviceStrategy", "64-true", "cpu/single_device/64-true"},
           {"ddp", "32", "cpu/ddp/32-true"}}) {
    auto args = base("fit", dir);
    for (const std::string a : {"--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.max_steps=3",
                                "--trainer.accelerator=cpu", "--trainer.limit_val_batches=0"})
      args.push_back(a);
    args.push_back("--trainer.strategy=" + strategy);
    args.push_back("--trainer.precision=" + precision);
    const cli::Outcome outcome = run(args);
    CHECK(outcome.combination == expected);
    REQUIRE(outcome.fit);
    CHECK(outcome.fit->global_step == 3);
  }
}

TEST_CASE("cli run: callbacks and loggers from the config, the resolved config saved with the run", "[cli]") {
  const std::string dir = test::scratch_folder("cli_saved");
  const std::string config = dir + "/run.yaml";
  std::ofstream(config) << "trainer:\n  max_epochs: 3\n  accelerator: cpu\n  callbacks:\n"
                           "  - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n    init_args:\n"
                           "      dirpath: " + dir + "/ckpt\n      save_last: true\n  - LearningRateMonitor\n"
                           "  - class_path: SpikeDetection\n    init_args:\n      window: 4\n"
                           "      exclude_batches_path: " + dir + "/spikes\n"
                           "  logger:\n  - class_path: CSVLogger\n    init_args:\n      flush_logs_every_n_steps: 1\n"
                           "model:\n  hidden: 5\n";
  auto args = base("fit", dir);
  args.push_back("--config=" + config);
  args.push_back("--model.lr=0.02");
  const cli::Outcome outcome = run(args);
  REQUIRE(outcome.fit);
  CHECK(outcome.fit->epochs.size() == 3);
  // The loggers: the config's keys as hyper-parameters; the learning rate logged by LearningRateMonitor.
  const std::string log_dir = dir + "/lightning_logs/version_0";
  CHECK(read(log_dir + "/config.yaml") == outcome.resolved_config);
  CHECK_THAT(read(log_dir + "/hparams.yaml"), Catch::Contains("model.lr: 0.02") && Catch::Contains("model.hidden: 5"));
  CHECK_THAT(read(log_dir + "/metrics.csv"), Catch::Contains("lr-SGD"));
  // The checkpoint says how it was made.
  const fulgur::StateDict checkpoint = fulgur::checkpoint::load(dir + "/ckpt/last.ckpt");
  const auto hparams = checkpoint.at("hyper_parameters").toGenericDict();
  CHECK(hparams.at("hidden").toInt() == 5);
  CHECK(hparams.at("lr").toDouble() == 0.02);
  CHECK(hparams.at("config").toStringRef() == outcome.resolved_config);
  // The callbacks a config names (each class held in a std::vector) keep their states in checkpoints.
  const auto states = checkpoint.at("callbacks").toGenericDict();
  bool has_checkpoint_state = false;
  for (const auto& entry : states) has_checkpoint_state |= entry.key().toStringRef().starts_with("ModelCheckpoint{");
  CHECK(has_checkpoint_state);
  CHECK(states.contains("SpikeDetection{'mode': 'min', 'window': 4}"));  // the config's detector, its window kept
  CHECK_THAT(outcome.resolved_config, Catch::Contains("seed_everything: 5"));

  // The checkpoint's weights for test and predict.
  auto test_args = base("test", dir);
  test_args.push_back("--ckpt_path=" + dir + "/ckpt/last.ckpt");
  test_args.push_back("--model.hidden=5");
  const cli::Outcome tested = run(test_args);
  REQUIRE(tested.evaluation.size() == 1);
  CHECK(tested.evaluation[0].metrics.at("test_mse") == Approx(outcome.fit->metrics.at("val_loss")).epsilon(1e-5));
  CHECK_THAT(test::message_of<fulgur::Error>([&] {  // the wrong architecture: an error, not a silent mismatch
               auto wrong = base("test", dir);
               wrong.push_back("--ckpt_path=" + dir + "/ckpt/last.ckpt");
               run(wrong);
             }),
             Catch::Contains("size mismatch for net.0.weight"));
  auto predict_args = base("predict", dir);
  predict_args.push_back("--ckpt_path=" + dir + "/ckpt/last.ckpt");
  predict_args.push_back("--model.hidden=5");
  CHECK(run(predict_args).predictions == 2);
  // "best" is the best of a fit in the same process: a command line that only tests has none.
  CHECK_THAT(test::message_of<fulgur::Error>([&] {
               auto best = base("test", dir);
               best.push_back("--ckpt_path=best");
               best.push_back("--model.hidden=5");
               run(best);
             }),
             Catch::Contains("test(ckpt_path = \"best\") is set but the ModelCheckpoint has saved no best checkpoint"));
}

TEST_CASE("cli run: SpikeDetection named for a module whose training_step returns no loss", "[cli]") {
  // Every CLI Trainer holds the shipped classes, so such a module compiles; naming the detector fails at once.
  struct NoLoss {
    int steps = 0;
  };
  fulgur::StepContext ctx;
  const fulgur::TrainerConfig config;
  torch::nn::Linear module(1, 1);
  fulgur::TrainerView view(ctx, config, *module, nullptr);
  cli::ConfiguredSpikeDetection detector;
  CHECK_THAT(config_error([&] { detector.on_train_batch_end(view, *module, NoLoss{}, 0, 0); }),
             Catch::Contains("training_step returns no loss"));
  detector.on_train_batch_end(view, *module, torch::tensor(1.0), 0, 0);  // a loss: checked as SpikeDetection does
  CHECK(detector.state_dict().at("seen").toInt() == 1);
}

TEST_CASE("cli run: print -> run -> print gives the same config, and the same run", "[cli]") {
  const std::string dir = test::scratch_folder("cli_round_trip");
  // seed_everything left true: a seed is drawn and printed, so the printed config repeats the run.
  const std::vector<std::string> args{"fit", "--trainer.default_root_dir=" + dir, "--trainer.max_epochs=2",
                                      "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
                                      "--trainer.logger=false", "--trainer.enable_checkpointing=false",
                                      "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
                                      "--data.batch_size=8"};
  auto print = args;
  print.push_back("--print_config");
  const std::string printed = run(print).resolved_config;
  CHECK_THAT(printed, Catch::Matches("(.|\n)*seed_everything: [0-9]+\n(.|\n)*"));
  const std::string file = dir + "/printed.yaml";
  std::ofstream(file) << printed;
  const cli::Outcome first = run({"fit", "--config", file});
  const cli::Outcome second = run({"fit", "--config", file});
  CHECK(first.resolved_config == printed);
  CHECK(second.resolved_config == printed);
  REQUIRE(first.fit);
  REQUIRE(second.fit);
  CHECK(first.fit->metrics.at("val_loss") == second.fit->metrics.at("val_loss"));  // the same seed: the same run
  CHECK(run({"fit", "--config", file, "--print_config"}).resolved_config == printed);
}

TEST_CASE("cli run: the run-time choice's errors", "[cli]") {
  const std::string dir = test::scratch_folder("cli_errors");
  auto with = [&](std::vector<std::string> extra) {
    auto args = base("fit", dir);
    args.insert(args.end(), extra.begin(), extra.end());
    return config_error([&] { run(args); });
  };
  // Valid names, a combination the program did not compile: the ones it did.
  CHECK_THAT(with({"--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.precision=bf16-mixed"}),
             Catch::Contains("no compiled combination is accelerator='cpu', strategy='ddp', precision='bf16-mixed'") &&
                 Catch::Contains("cpu/single_device/32-true, cpu/single_device/bf16-mixed"));
  // A name from elsewhere, or misspelt: the one probably meant (the same words as fulgur::dispatch's).
  CHECK_THAT(with({"--trainer.precision=fp16"}),
             Catch::Contains("trainer.precision: expected one of this program's '32-true'") &&
                 Catch::Contains("got 'fp16'; did you mean '16-mixed'? ('16-true' keeps the weights in float16 too.)"));
  CHECK_THAT(with({"--trainer.precision=bf16-mixd"}), Catch::Contains("got 'bf16-mixd'; did you mean 'bf16-mixed'?"));
  CHECK_THAT(with({"--trainer.accelerator=CPUU"}), Catch::Contains("got 'CPUU'; did you mean 'cpu'?"));
  CHECK_THAT(with({"--trainer.precision=fp8"}), Catch::Contains("got 'fp8'") && !Catch::Contains("did you mean"));
  // Lightning's alias of a precision this program did not compile (probe 8: it was told only the list).
  CHECK_THAT(with({"--trainer.precision=16"}),
             Catch::Contains("got '16'; '16' is '16-mixed', which this program did not compile"));
  // The Trainer's settings and each callback's refusals, together and each where it was given (probe 8: only
  // ModelCheckpoint's, bare, was said).
  CHECK_THAT(with({"--trainer.max_epochs=-5", "--trainer.callbacks+=ModelCheckpoint",
                   "--trainer.callbacks.every_n_epochs=-2", "--trainer.callbacks+=EarlyStopping"}),
             Catch::Contains("3 problems") &&
                 Catch::Contains("the Trainer refuses this config: trainer.max_epochs must be >= -1") &&
                 Catch::Contains("trainer.callbacks[0] (ModelCheckpoint): Invalid value for every_n_epochs=-2") &&
                 Catch::Contains("trainer.callbacks[1] (EarlyStopping): EarlyStopping needs a metric to monitor"));
  // --help with a file that cannot be applied says why, rather than showing the defaults without it (probe).
  const std::string bad_file = dir + "/bad.yaml";
  std::ofstream(bad_file) << "trainer:\n  max_epoch: 2\n";
  CHECK_THAT(config_error([&] { run({"fit", "--config", bad_file, "--help"}); }),
             Catch::Contains("unknown key 'trainer.max_epoch'; did you mean trainer.max_epochs?"));
  CHECK_THAT(config_error([&] { run({"fit", "--config", dir + "/missing.yaml", "--help"}); }),
             Catch::Contains("missing.yaml"));
  // A log directory that cannot be made: named by the keys that place it (a probe found std::filesystem's raw text).
  CHECK_THAT(with({"--trainer.default_root_dir=/proc/fulgur_probe/run"}),
             Catch::Contains("cannot create the folder /proc/fulgur_probe") &&
                 Catch::Contains("trainer.default_root_dir, or the logger's save_dir") &&
                 !Catch::Contains("filesystem error"));
  // A strategy fulgur has but this program did not compile.
  CHECK_THAT(with({"--trainer.strategy=fsdp"}),
             Catch::Contains("'fsdp' is not a class this program compiled for it; it takes auto, single_device, ddp"));
  // The strategy's options are its init_args, checked by name.
  CHECK_THAT(with({"--trainer.strategy=ddp", "--trainer.strategy.timeot=60"}),
             Catch::Contains("trainer.strategy (ddp): unknown key 'timeot'; did you mean timeout?"));
  CHECK_THAT(with({"--trainer.strategy=single_device", "--trainer.strategy.timeout=60"}),
             Catch::Contains("single_device takes no init_args"));
  // A config the Trainer refuses is refused before anything runs.
  CHECK_THAT(with({"--trainer.accumulate_grad_batches=0"}), Catch::Contains("accumulate_grad_batches"));
  // A checkpoint path that names nothing: said before the module, the data or the Trainer is built.
  CHECK_THAT(with({"--ckpt_path=no_such_dir/epoch=3.ckpt"}),
             Catch::Contains("ckpt_path=no_such_dir/epoch=3.ckpt: no such checkpoint (looked at /") &&
                 Catch::Contains("/no_such_dir/epoch=3.ckpt and " + fulgur::detail::absolute_path(dir)) &&
                 Catch::Contains("give an existing checkpoint file, or last, best or hpc"));
  // Several such values at once: one run names them all, in the config's keys.
  CHECK_THAT(with({"--trainer.accumulate_grad_batches=0", "--trainer.log_every_n_steps=0"}),
             Catch::Contains("the Trainer refuses this config: the trainer section has 2 problems:\n"
                             "  trainer.accumulate_grad_batches must be >= 1, got 0.\n"
                             "  trainer.log_every_n_steps must be >= 1, got 0.") &&
                 !Catch::Contains("TrainerConfig"));
  // Two callbacks whose states would overwrite each other in a checkpoint (Lightning refuses them too).
  CHECK_THAT(with({"--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
                   "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss"}),
             Catch::Contains("two stateful callbacks have the state key EarlyStopping{'monitor': 'val_loss'"));
}

TEST_CASE("cli run: a LibTorch error from the module's constructor or the fit is one line, no C++ stack (probe)",
          "[cli]") {
  const std::string dir = test::scratch_folder("cli_torch_errors");
  const auto main_with = [&](const std::vector<std::string>& extra) { return main_fit(dir, extra); };
  const auto [code, text] = main_with({"--model.hidden=-4"});
  CHECK(code == 1);
  CHECK_THAT(text, Catch::StartsWith("tiny: the module's constructor failed on the config's model keys (--print_config "
                                     "shows them): Trying to create tensor with negative dimension -4") &&
                       !Catch::Contains("frame #"));
  // A data key a loader refuses: a config error (exit 2) that says which keys, as the module's do (probe 8:
  // a bare "TensorLoader: batch_size must be > 0", exit 1).
  const auto [data_code, data_text] = main_with({"--data.batch_size=0"});
  CHECK(data_code == 2);
  CHECK_THAT(data_text, Catch::StartsWith("fulgur::cli: the data module's train_dataloader() refuses the config's data "
                                          "keys (--print_config shows them): TensorLoader: batch_size must be > 0"));
  const auto [nan_code, nan_text] = main_with({"--model.lr=.nan"});  // SGD refuses it in configure_optimizers
  CHECK(nan_code == 1);
  CHECK_THAT(nan_text, Catch::Contains("Invalid learning rate: nan") && !Catch::Contains("frame #"));
}

TEST_CASE("cli run: a hint names the setting as the command line sets it, a C++ program's as C++ does (probe F4)",
          "[cli]") {
  const std::string dir = test::scratch_folder("cli_host_terms");
  const auto [code, text] = main_fit(dir, {"--model.lr=1e30", "--trainer.max_epochs=3", "--trainer.logger=false",
                                           "--trainer.callbacks+=OnExceptionCheckpoint",
                                           "--trainer.callbacks.dirpath=" + dir + "/exc"});
  CHECK(code == 1);  // lr 1e30: the loss is NaN within a few steps
  CHECK_THAT(text, Catch::Contains("Resume with --ckpt_path=" + dir + "/exc/on_exception.ckpt once the cause is fixed"));
  CHECK_THAT(text, Catch::Contains("clip gradients (trainer.gradient_clip_val)") &&
                       Catch::Contains("set --trainer.finite_loss_check=every_step to stop at the first bad batch"));
  CHECK_THAT(text, !Catch::Contains("TrainerConfig") && !Catch::Contains("FitOptions") &&
                       !Catch::Contains("FiniteLossCheck::"));
  std::vector<std::string> without_logger = base("fit", dir + "/lr");
  for (const char* extra : {"--trainer.max_steps=1", "--trainer.logger=false", "--trainer.callbacks+=LearningRateMonitor"})
    without_logger.emplace_back(extra);
  CHECK_THAT(config_error([&] { run(without_logger); }),
             Catch::Contains("has no logger: set trainer.logger (true, CSVLogger or TensorBoardLogger).") &&
                 !Catch::Contains("fulgur::CSVLogger"));
  const auto minimum = main_fit(dir + "/min", {"--trainer.min_epochs=3", "--trainer.max_epochs=1", "--trainer.logger=false"});
  CHECK(minimum.first == 0);  // a warning: the maximum ends fit, as in Lightning
  CHECK_THAT(minimum.second, Catch::Contains("fulgur: --trainer.min_epochs=3 is more than --trainer.max_epochs=1: fit "
                                             "stops at max_epochs, so the minimum is not reached."));

  // The command line's reader ends with its run: a C++ program in the same process reads C++ again.
  Tiny module(tiny::TinyConfig{.hidden = 8, .lr = 1e30});
  TinyData data({});
  data.setup("fit");
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision> trainer(
      test::quiet({.max_epochs = 3, .default_root_dir = dir + "/cpp"}));
  const std::string error = test::message_of<fulgur::NonFiniteLossError>([&] { trainer.fit(module, data.train_dataloader()); });
  CHECK_THAT(error, Catch::Contains("clip gradients (TrainerConfig::gradient_clip_val)") &&
                        Catch::Contains("set TrainerConfig::finite_loss_check = FiniteLossCheck::every_step to stop"));
}

TEST_CASE("cli run: runs sharing a folder keep each one's config, and say where this one's went (probe)", "[cli]") {
  const std::string dir = test::scratch_folder("cli_config_versions");
  const auto fit = [&](const std::string& steps) {
    auto args = base("fit", dir);
    args.insert(args.end(), {"--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.max_steps=" + steps});
    std::ostringstream captured;
    std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
    run(args);
    std::cerr.rdbuf(original);
    return captured.str();
  };
  CHECK_THAT(fit("2"), !Catch::Contains("holds another run's config"));
  CHECK_THAT(fit("2"), !Catch::Contains("holds another run's config"));  // the same config: left alone
  CHECK_THAT(fit("3"), Catch::Contains("fulgur::cli: " + dir + "/config.yaml holds another run's config; this run's is " +
                                       dir + "/config-v1.yaml"));
  CHECK_THAT(read(dir + "/config.yaml"), Catch::Contains("max_steps: 2"));
  CHECK_THAT(read(dir + "/config-v1.yaml"), Catch::Contains("max_steps: 3"));
}

TEST_CASE("cli run: an incompatible combination gives the compile-time rule's sentence", "[cli]") {
  constexpr auto nccl = fulgur::compatible_trainers(
      fulgur::shipped_accelerators, hana::tuple_t<SingleDeviceStrategy, fulgur::BasicDDPStrategy<fulgur::backend::NCCL>>,
      hana::tuple_t<FloatPrecision>);
  const std::string dir = test::scratch_folder("cli_rule");
  auto args = base("fit", dir);
  args.insert(args.begin(), "tiny");
  args.push_back("--trainer.accelerator=cpu");
  args.push_back("--trainer.strategy=ddp");
  const auto message = config_error([&] { cli::run<Tiny, TinyData>(args, nccl); });
  CHECK_THAT(message, Catch::Contains(FULGUR_MSG_STRATEGY_ACCELERATOR));
}
