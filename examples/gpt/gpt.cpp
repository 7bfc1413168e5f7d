// A byte-level GPT trained from text on disk (nanoGPT's recipe, at a size two CPU cores train in
// minutes): the text becomes token files, a TokenDataset + DataLoader (worker threads) feeds fit,
// bf16-mixed autocast, fused AdamW, linear warm-up into a cosine decay, gradient clipping,
// ModelCheckpoint (best and last; --resume continues from last.ckpt exactly), TensorBoard and CSV
// logs, validation loss, and a few lines of generated text at the end. docs/gpt-example.md.
//
//   gpt prepare TEXT_FILE [--out DIR] [--val-fraction 0.1]        writes DIR/train.bin and DIR/val.bin
//   gpt train [--data DIR] [--out DIR] [--max-steps 1500] [--val-every 250] [--batch-size 32]
//             [--workers 2] [--precision bf16-mixed|32-true] [--accelerator cpu|cuda] [--seed 0]
//             [--resume] [--goal LOSS] [--stop-at-step N]
// --max-steps sets the run's length (and so the schedule's); --stop-at-step ends this process's part
// of it early, as Ctrl-C or a preemption would, so that --resume can continue it. train exits 1 when the final validation loss is above --goal (when given). scripts/demo.sh gpt runs
// both steps on Python's own documentation text.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <type_traits>
#include <iostream>
#include <string>

#include "corpus.hpp"
#include "model.hpp"

namespace {

struct TrainArguments {
  std::string data = "data/gpt", out = "gpt_run", precision = "bf16-mixed", accelerator = "auto";
  std::int64_t max_steps = 1500, val_every = 250, batch_size = 32, seed = 0;
  std::int64_t stop_at_step = 0;  // 0: max_steps
  int workers = 2;
  bool resume = false;
  double goal = 0.0;  // 0: none
};

struct TrainOutcome {
  double val_loss = 0.0;
  double tokens_per_second = 0.0;
  bool interrupted = false;  // Ctrl-C: fit saved nothing more; --resume continues from the last checkpoint
};

template <class Combination>
TrainOutcome train(const TrainArguments& args) {
  using Trainer = typename Combination::template with_callbacks<fulgur::ModelCheckpoint, fulgur::LearningRateMonitor,
                                                                fulgur::Timer, fulgur::TensorBoardLogger,
                                                                fulgur::CSVLogger>;
  gpt::GptConfig config{.max_steps = args.max_steps};
  config.warmup_steps = std::min<std::int64_t>(config.warmup_steps, args.max_steps / 10 + 1);

  // Every position starts a training window (stride 1): a shuffled epoch is nanoGPT's random windows
  // drawn without replacement. Validation reads each token once, in disjoint windows.
  fulgur::data::TokenDataset train_tokens(args.data + "/train.bin", {.context = config.context, .stride = 1});
  fulgur::data::TokenDataset val_tokens(args.data + "/val.bin", {.context = config.context});
  const bool cuda = std::string(Combination::accelerator_type::name) == "cuda";
  fulgur::data::DataLoader train_loader(train_tokens, {.batch_size = args.batch_size,
                                                       .shuffle = true,
                                                       .num_workers = args.workers,
                                                       .pin_memory = cuda,
                                                       .seed = static_cast<std::uint64_t>(args.seed)});
  fulgur::data::DataLoader val_loader(val_tokens,
                                      {.batch_size = args.batch_size, .num_workers = args.workers, .pin_memory = cuda});

  Trainer trainer({.max_steps = args.stop_at_step > 0 ? args.stop_at_step : args.max_steps,
                   .gradient_clip_val = 1.0,
                   .seed = static_cast<std::uint64_t>(args.seed),
                   .val_check_interval = args.val_every,
                   // unset: validation every val_every steps counted across epochs (never at an epoch's
                   // end by itself), so the last validation ran at the last step exactly when
                   // max_steps is a multiple of val_every, even when epochs are short.
                   .check_val_every_n_epoch = std::nullopt,
                   .log_every_n_steps = 25,
                   .default_root_dir = args.out},
                  // A fixed folder (not the logger's version_N), so that --resume finds last.ckpt.
                  fulgur::ModelCheckpoint({.dirpath = args.out + "/checkpoints",
                                           .filename = "{step}-{val_loss:.3f}",
                                           .monitor = "val_loss",
                                           .save_last = true}),
                  fulgur::LearningRateMonitor(), fulgur::Timer(), fulgur::TensorBoardLogger(), fulgur::CSVLogger());
  trainer.print("gpt: ", train_tokens.num_tokens(), " training and ", val_tokens.num_tokens(),
                " validation tokens; ", trainer.combination_name(), ", ", args.workers, " loader workers");

  gpt::Gpt model(config);
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  trainer.print("gpt: ", config.layers, " blocks of width ", config.width, ", ", parameters, " parameters");

  const fulgur::FitResult fit = trainer.fit(model, train_loader, val_loader, {.ckpt_path = args.resume ? "last" : ""});
  if (fit.interrupted) {  // Ctrl-C: fit finished the step under way and returned; nothing more is saved
    const std::string last = args.out + "/checkpoints/last.ckpt";
    if (std::filesystem::exists(last))
      trainer.print("interrupted at step ", fit.global_step, "; `gpt train --resume` with the same arguments continues "
                    "from ", last, ", written at the last validation (every ", args.val_every, " steps)");
    else
      trainer.print("interrupted at step ", fit.global_step, " before the first checkpoint (step ", args.val_every,
                    "): nothing to resume from");
    return {.interrupted = true};
  }
  // Training time without fit's validation runs (and its sanity check), over all parts of a resumed run.
  const auto& timer = trainer.template callback<fulgur::Timer>();
  const double training_seconds =
      timer.time_elapsed(fulgur::Timer::Phase::train) - timer.time_elapsed(fulgur::Timer::Phase::validate);
  // The loss on the final weights: fit's last validation when it ran at the last step, else one more.
  const double val_loss = fit.global_step % args.val_every == 0 && fit.metrics.contains("val_loss")
                              ? fit.metrics.at("val_loss")
                              : trainer.validate(model, val_loader).metrics.at("val_loss");
  const double tokens = static_cast<double>(fit.global_step * args.batch_size * config.context);
  TrainOutcome outcome{.val_loss = val_loss, .tokens_per_second = tokens / training_seconds};
  trainer.print("fit stopped: ", fit.stop_reason, "; best checkpoint ",
                trainer.template callback<fulgur::ModelCheckpoint>().best_model_path());
  trainer.print("logs: ", trainer.template callback<fulgur::TensorBoardLogger>().log_dir(),
                " (tensorboard --logdir ", args.out, ")");

  at::Generator sampling = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(args.seed));
  const std::string prompt = "The ";
  const auto text = model->generate(std::vector<std::int64_t>(prompt.begin(), prompt.end()), 300, 0.8, 40, sampling);
  trainer.print("---- generated ----\n", gpt::decode(text), "\n-------------------");
  return outcome;
}

/// argv[i] as a number, or an error naming the flag.
template <class Number>
Number number_after(const std::string& flag, const char* text) {
  std::size_t used = 0;
  try {
    const double value = std::stod(text, &used);
    if (used == std::string(text).size() && (std::is_floating_point_v<Number> || value == static_cast<Number>(value)))
      return static_cast<Number>(value);
  } catch (const std::exception&) {
  }
  throw std::runtime_error(flag + " takes " +
                           (std::is_floating_point_v<Number> ? "a number" : "an integer") + ", got '" + text + "'");
}

int prepare(int argc, char** argv) {
  std::string text, out = "data/gpt";
  double val_fraction = 0.1;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) out = argv[++i];
    else if (arg == "--val-fraction" && i + 1 < argc) val_fraction = number_after<double>(arg, argv[++i]);
    else if (text.empty() && !arg.starts_with("--")) text = arg;
    else throw std::runtime_error("unknown argument " + arg);
  }
  if (text.empty()) throw std::runtime_error("prepare: give the text file to train on");
  const auto made = gpt::prepare_corpus(text, out, val_fraction, gpt::GptConfig{}.context);
  std::printf("wrote %s/train.bin (%lld tokens) and %s/val.bin (%lld tokens)\n", out.c_str(),
              static_cast<long long>(made.train_tokens), out.c_str(), static_cast<long long>(made.val_tokens));
  return 0;
}

TrainArguments parse_train(int argc, char** argv) {
  TrainArguments args;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--resume") args.resume = true;
    else if (arg == "--data" && has_value) args.data = argv[++i];
    else if (arg == "--out" && has_value) args.out = argv[++i];
    else if (arg == "--precision" && has_value) args.precision = argv[++i];
    else if (arg == "--accelerator" && has_value) args.accelerator = argv[++i];
    else if (arg == "--max-steps" && has_value) args.max_steps = number_after<std::int64_t>(arg, argv[++i]);
    else if (arg == "--val-every" && has_value) args.val_every = number_after<std::int64_t>(arg, argv[++i]);
    else if (arg == "--batch-size" && has_value) args.batch_size = number_after<std::int64_t>(arg, argv[++i]);
    else if (arg == "--workers" && has_value) args.workers = number_after<int>(arg, argv[++i]);
    else if (arg == "--seed" && has_value) args.seed = number_after<std::int64_t>(arg, argv[++i]);
    else if (arg == "--goal" && has_value) args.goal = number_after<double>(arg, argv[++i]);
    else if (arg == "--stop-at-step" && has_value) args.stop_at_step = number_after<std::int64_t>(arg, argv[++i]);
    else throw std::runtime_error("unknown argument " + arg + " (see the top of examples/gpt/gpt.cpp)");
  }
  if (args.max_steps < 1) throw std::runtime_error("--max-steps must be at least 1");
  if (!std::filesystem::exists(args.data + "/train.bin"))
    throw std::runtime_error(args.data + "/train.bin does not exist: write it (and val.bin) with "
                             "`gpt prepare TEXT_FILE --out " + args.data + "`, or pass --data DIR");
  if (args.accelerator == "auto") args.accelerator = torch::cuda::is_available() ? "cuda" : "cpu";
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "prepare") return prepare(argc, argv);
    if (command != "train") {
      std::cerr << "usage: gpt prepare TEXT_FILE [--out DIR] | gpt train [--data DIR] [--out DIR] ... "
                   "(see the top of examples/gpt/gpt.cpp)\n";
      return 2;
    }
    const TrainArguments args = parse_train(argc, argv);
    // Two precisions on either device: the only combinations this program compiles.
    constexpr auto combinations = fulgur::compatible_trainers(
        fulgur::shipped_accelerators, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>,
        boost::hana::tuple_t<fulgur::BF16MixedPrecision, fulgur::FloatPrecision>);
    const TrainOutcome outcome = fulgur::dispatch(
        args.accelerator, "single_device", args.precision,
        [&](auto trainer_type) { return train<typename decltype(trainer_type)::type>(args); }, combinations);
    if (outcome.interrupted) return 130;  // the shell's code for a run ended by SIGINT
    std::printf("validation loss %.4f (%s), %.0f tokens/s\n", outcome.val_loss, args.precision.c_str(),
                outcome.tokens_per_second);
    if (args.goal > 0.0 && !(outcome.val_loss <= args.goal)) {
      std::printf("the validation loss is above the goal %.3f\n", args.goal);
      return 1;
    }
    return 0;
  } catch (const fulgur::MisconfigurationError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gpt: " << e.what() << "\n";
    return 2;
  }
}
