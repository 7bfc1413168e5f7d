// A byte-level GPT trained from text on disk (nanoGPT's recipe, at a size two CPU cores train in
// minutes), as a fulgur::cli program: a TokenDataset + DataLoader (worker threads) feed fit, bf16-mixed
// autocast, fused AdamW, linear warm-up into a cosine decay, gradient clipping, ModelCheckpoint (best
// and last; --ckpt_path=last continues exactly), TensorBoard and CSV logs, and a few lines of generated
// text at the end. docs/gpt-example.md.
//
//   gpt prepare TEXT_FILE [--out DIR] [--val-fraction 0.1]      writes DIR/train.bin and DIR/val.bin
//   gpt fit [--config FILE] [--data.dir=DIR] [--trainer.max_steps=N] [--model.width=N] ... [--goal LOSS]
//   gpt validate|test --ckpt_path=last ...                      the loss of a checkpoint's weights
//   gpt fit --help                                              every key, its type, default and doc
// model.max_steps is the schedule's length; trainer.max_steps (by default the same) may stop a run
// earlier, as Ctrl-C or a preemption would, and --ckpt_path=last continues it. --goal is this
// program's own flag: fit exits 1 when the final validation loss is above it.
#include <fulgur/cli.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <iostream>
#include <string>

#include "corpus.hpp"
#include "model.hpp"

namespace {

struct TokenDataConfig {
  std::string dir = "data/gpt";
  std::int64_t batch_size = 32;
  int workers = 2;
  std::int64_t context = 128;  ///< linked to model.context
  std::int64_t stride = 1;
  std::optional<bool> pin_memory{};  ///< null: when a CUDA device is present
  std::uint64_t seed = 0;
  static constexpr auto fields() {
    using fulgur::cli::field;
    using C = TokenDataConfig;
    return std::tuple(field("dir", &C::dir, "folder of train.bin and val.bin (`gpt prepare TEXT --out DIR` writes them)"),
                      field("batch_size", &C::batch_size, "windows per batch"),
                      field("workers", &C::workers, "loader worker threads"),
                      field("context", &C::context, "tokens per window (follows model.context)"),
                      field("stride", &C::stride, "tokens between training windows (1: every position)"),
                      field("pin_memory", &C::pin_memory, "page-locked batches, copied on a side stream (null: when a CUDA device is present)"),
                      field("seed", &C::seed, "the shuffle's seed"));
  }
};

/// The data module: every position starts a training window (stride 1, so a shuffled epoch is nanoGPT's
/// random windows drawn without replacement); validation reads each token once, in disjoint windows.
class TokenData {
 public:
  using config_type = TokenDataConfig;
  explicit TokenData(TokenDataConfig config) : config_(std::move(config)) {
    if (!config_.pin_memory) config_.pin_memory = torch::cuda::is_available();
  }
  void setup(std::string_view) {
    if (!std::filesystem::exists(config_.dir + "/train.bin"))
      throw std::runtime_error(config_.dir + "/train.bin does not exist: write it (and val.bin) with `gpt prepare "
                               "TEXT_FILE --out " + config_.dir + "`, or set --data.dir");
    train_.emplace(config_.dir + "/train.bin",
                   fulgur::data::TokenDatasetOptions{.context = config_.context, .stride = config_.stride});
    val_.emplace(config_.dir + "/val.bin", fulgur::data::TokenDatasetOptions{.context = config_.context});
    std::printf("gpt: %lld training and %lld validation tokens\n", static_cast<long long>(train_->num_tokens()),
                static_cast<long long>(val_->num_tokens()));
  }
  auto train_dataloader() {
    return fulgur::data::DataLoader(*train_, {.batch_size = config_.batch_size, .shuffle = true,
                                              .num_workers = config_.workers, .pin_memory = *config_.pin_memory,
                                              .seed = config_.seed});
  }
  auto val_dataloader() { return evaluation_loader(); }
  auto test_dataloader() { return evaluation_loader(); }

 private:
  fulgur::data::DataLoader<fulgur::data::TokenDataset> evaluation_loader() {
    return fulgur::data::DataLoader(*val_, {.batch_size = config_.batch_size, .num_workers = config_.workers,
                                            .pin_memory = *config_.pin_memory});
  }
  TokenDataConfig config_;
  std::optional<fulgur::data::TokenDataset> train_, val_;
};

/// The run this program makes unless told otherwise: 1500 steps in bf16-mixed (32-true on a CPU without
/// fast bfloat16 kernels, see default_settings), validation every 250 steps
/// counted across epochs (check_val_every_n_epoch null, so the last validation is at the last step),
/// checkpoints in a fixed folder that --ckpt_path=last finds (ModelCheckpoint last in the list:
/// --trainer.callbacks.dirpath moves them).
constexpr const char* defaults = R"(
seed_everything: 0
trainer:
  precision: bf16-mixed
  max_steps: 1500
  gradient_clip_val: 1.0
  val_check_interval: 250
  check_val_every_n_epoch: null
  log_every_n_steps: 25
  default_root_dir: gpt_run
  enable_model_summary: false
  callbacks:
  - LearningRateMonitor
  - class_path: ModelCheckpoint
    init_args:
      dirpath: gpt_run/checkpoints
      filename: "{step}-{val_loss:.3f}"
      monitor: val_loss
      save_last: true
  logger: [TensorBoardLogger, CSVLogger]
)";

/// bf16-mixed where it is fast: on a GPU, or a CPU with AVX-512 or AMX. On an AVX2-only CPU bfloat16
/// matrix products run tens of times slower than float32 (docs/precision.md), so 32-true is the default
/// there, said once; --trainer.precision=bf16-mixed still asks for it.
std::string default_settings(const std::vector<std::string>& args) {
  std::string settings = defaults;
  if (fulgur::CPUAccelerator::has_fast_reduced_precision() || torch::cuda::is_available()) return settings;
  constexpr std::string_view bf16 = "precision: bf16-mixed";
  const std::size_t at = settings.find(bf16);
  if (at == std::string::npos) return settings;  // the defaults above name another precision: nothing to swap
  settings.replace(at, bf16.size(), "precision: 32-true");
  const bool asked = std::ranges::any_of(args, [](const std::string& a) { return a.starts_with("--trainer.precision"); });
  if (!asked && args.size() > 1 && args[1] == "fit")
    std::cerr << "gpt: this CPU has no fast bfloat16 kernels (no AVX-512 or AMX): training in 32-true "
                 "(--trainer.precision=bf16-mixed asks for bf16-mixed all the same)\n";
  return settings;
}

/// argv[i] as a number, or an error naming the flag.
double number_after(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  try {
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw fulgur::MisconfigurationError(flag + " takes a number, got '" + text + "'");
}

int prepare(int argc, char** argv) {
  std::string text, out = "data/gpt";
  double val_fraction = 0.1;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) out = argv[++i];
    else if (arg == "--val-fraction" && i + 1 < argc) val_fraction = number_after(arg, argv[++i]);
    else if (text.empty() && !arg.starts_with("--")) text = arg;
    else throw std::runtime_error("unknown argument " + arg);
  }
  if (text.empty()) throw std::runtime_error("prepare: give the text file to train on");
  const auto made = gpt::prepare_corpus(text, out, val_fraction, gpt::GptConfig{}.context);
  std::printf("wrote %s/train.bin (%lld tokens) and %s/val.bin (%lld tokens)\n", out.c_str(),
              static_cast<long long>(made.train_tokens), out.c_str(), static_cast<long long>(made.val_tokens));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  try {
    if (args.size() > 1 && args[1] == "prepare") return prepare(argc, argv);
    double goal = 0.0;  // this program's own flag, taken out before the CLI reads the rest
    for (std::size_t i = 1; i < args.size(); ++i)
      if (args[i] == "--goal" && i + 1 < args.size()) {
        goal = number_after("--goal", args[i + 1]);
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
        break;
      } else if (args[i].starts_with("--goal=")) {
        goal = number_after("--goal", args[i].substr(7));
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    // Two precisions on either device: the only combinations this program compiles.
    constexpr auto combinations = fulgur::compatible_trainers(
        fulgur::shipped_accelerators, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>,
        boost::hana::tuple_t<fulgur::BF16MixedPrecision, fulgur::FloatPrecision>);
    const fulgur::cli::Outcome outcome = fulgur::cli::run<gpt::Gpt, TokenData>(
        args, combinations, fulgur::cli::shipped_classes{},
        {.description = "A byte-level GPT on text from disk. First `gpt prepare TEXT_FILE --out DIR` writes the "
                        "token files; then `gpt fit --data.dir=DIR` (docs/gpt-example.md). --goal LOSS: fit exits 1 "
                        "above that final validation loss.",
         .defaults = default_settings(args),
         .links = {{"model.context", "data.context"}}});
    if (outcome.exit_code != 0 || !outcome.fit || goal <= 0.0) return outcome.exit_code;
    const double val_loss = outcome.fit->metrics.count("val_loss") ? outcome.fit->metrics.at("val_loss") : INFINITY;
    if (!(val_loss <= goal)) {
      std::printf("the validation loss %.4f is above the goal %.3f\n", val_loss, goal);
      return 1;
    }
    return 0;
  } catch (const fulgur::MisconfigurationError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gpt: " << e.what() << "\n";
    return 1;
  }
}
