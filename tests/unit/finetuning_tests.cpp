// Fine-tuning schedules (issue 34): GradientAccumulationScheduler and BackboneFinetuning. Lightning's
// factors, lrs and messages come from the venv at test time (tests/unit/finetuning_reference.py,
// which drives Lightning's callbacks on a tiny module).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "fulgur/callbacks/backbone_finetuning.hpp"
#include "fulgur/callbacks/gradient_accumulation_scheduler.hpp"
#include "src/distributed/reducer.hpp"  // the DDP reducer's buckets, which a user never reads
#include "unit/support.hpp"

using namespace fulgur;

namespace {

/// "<case> <key> <value...>" lines: case -> key -> the rest of the line.
using Reference = std::map<std::string, std::map<std::string, std::string>>;

const Reference& lightning() {
  static const Reference reference = [] {
    const std::string out = test::scratch_folder("finetuning_reference") + "/out.txt";
    const std::string line = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                             "/tests/unit/finetuning_reference.py " + out + " 2>/dev/null";
    if (std::system(line.c_str()) != 0) throw std::runtime_error("the Python reference failed: " + line);
    Reference r;
    std::ifstream in(out);
    std::string c, key, rest;
    while (in >> c >> key && std::getline(in, rest)) r[c][key] = rest.substr(1);
    if (r.empty()) throw std::runtime_error("the Python reference wrote nothing: " + line);
    return r;
  }();
  return reference;
}
double number(const std::string& c, const std::string& key) { return std::strtod(lightning().at(c).at(key).c_str(), nullptr); }

/// Counts the optimizer steps of each epoch.
struct StepCounter {
  std::map<std::int64_t, int> steps;
  void on_before_optimizer_step(TrainerView& trainer) { ++steps[trainer.current_epoch()]; }
};

/// Saves a checkpoint after one batch of one epoch.
struct SaveAt {
  std::int64_t epoch, batch;
  std::string path;
  void on_train_batch_end(TrainerView& trainer) {
    if (trainer.current_epoch() == epoch && trainer.batch_idx() == batch) trainer.save_checkpoint(path);
  }
};

// ---- GradientAccumulationScheduler --------------------------------------------------------------------

struct SmallImpl : torch::nn::Module {
  SmallImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc2(torch::dropout(torch::relu(fc1(b.input)), 0.2, is_training())), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Small);

data::TensorLoader small_loader(std::int64_t n) {
  auto [x, y] = test::classification_data(n, 3);
  return data::TensorLoader(x, y, {.batch_size = 4, .shuffle = true, .seed = 5});
}

}  // namespace

TEST_CASE("GradientAccumulationScheduler: Lightning's factor for each epoch, optimizer steps counted per epoch",
          "[finetuning][accumulation]") {
  const std::map<std::string, std::map<std::int64_t, std::int64_t>> schedules{
      {"sched_a", {{1, 2}, {3, 4}}}, {"sched_b", {{2, 3}}}, {"sched_c", {{0, 5}, {2, 1}}}};
  for (const auto& [name, scheduling] : schedules) {
    const GradientAccumulationScheduler scheduler(scheduling);
    for (std::int64_t epoch = 0; epoch < 6; ++epoch)
      CHECK(scheduler.accumulate_grad_batches(epoch) == std::stoll(lightning().at(name).at(std::to_string(epoch))));
  }
  // In a fit: 7 batches an epoch; a window that the epoch's end cuts short steps there (as Lightning).
  torch::manual_seed(0);
  Small net;
  test::CpuTrainer<FloatPrecision, GradientAccumulationScheduler, StepCounter> trainer(
      test::quiet({.max_epochs = 5}), GradientAccumulationScheduler({{1, 2}, {3, 4}}), StepCounter{});
  auto loader = small_loader(28);
  const FitResult result = trainer.fit(net, loader);
  const auto& steps = trainer.callback<StepCounter>().steps;
  int total = 0;
  for (std::int64_t epoch = 0; epoch < 5; ++epoch) {
    const auto factor = std::stoll(lightning().at("sched_a").at(std::to_string(epoch)));
    CHECK(steps.at(epoch) == (7 + factor - 1) / factor);
    total += steps.at(epoch);
  }
  CHECK(result.global_step == total);
  CHECK(trainer.config().accumulate_grad_batches == 1);  // the Trainer's own factor again after fit
}

TEST_CASE("GradientAccumulationScheduler: a fit resumed inside a window after the factor changed ends bit-identical",
          "[finetuning][accumulation][checkpoint]") {
  const std::string folder = test::scratch_folder("accumulation_resume");
  const auto run = [&](bool save, const std::string& resume) {
    torch::manual_seed(0);
    Small net;
    test::CpuTrainer<FloatPrecision, GradientAccumulationScheduler, SaveAt> trainer(
        test::quiet({.max_epochs = 3}), GradientAccumulationScheduler({{1, 3}}),
        SaveAt{save ? 1 : -1, 4, folder + "/mid.ckpt"});  // epoch 1, after its 5th batch: 2 of 3 in the window
    auto loader = small_loader(28);
    const FitResult result = trainer.fit(net, loader, FitOptions{.ckpt_path = resume});
    return std::pair{result.global_step, test::snapshot(*net)};
  };
  const auto [straight_steps, straight] = run(true, "");
  const auto [resumed_steps, resumed] = run(false, folder + "/mid.ckpt");
  CHECK(straight_steps == 7 + 3 + 3);
  CHECK(resumed_steps == straight_steps);
  REQUIRE(straight.size() == resumed.size());
  for (std::size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i], resumed[i]));
  // Without the scheduler, the window's length would differ: fit refuses.
  torch::manual_seed(0);
  Small net;
  test::CpuTrainer<FloatPrecision> plain(test::quiet({.max_epochs = 3}));
  auto loader = small_loader(28);
  CHECK_THAT(test::message_of<CheckpointError>([&] { plain.fit(net, loader, FitOptions{.ckpt_path = folder + "/mid.ckpt"}); }),
             Catch::Contains("inside a gradient-accumulation window (batch 2 of 3"));
}

namespace {
struct ManualImpl : torch::nn::Module {
  static constexpr bool automatic_optimization = false;
  ManualImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  void training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    auto& opt = ctx.optimizer(0);
    opt.zero_grad();
    ctx.manual_backward(torch::nn::functional::cross_entropy(fc(b.input), b.target));
    opt.step();
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Manual);
}  // namespace

TEST_CASE("GradientAccumulationScheduler: Lightning's refusals and messages", "[finetuning][accumulation][errors]") {
  using S = std::map<std::int64_t, std::int64_t>;
  CHECK(test::message_of<MisconfigurationError>([] { GradientAccumulationScheduler(S{{-1, 2}, {3, 4}}); }) ==
        lightning().at("bad_epoch").at("message"));
  CHECK(test::message_of<MisconfigurationError>([] { GradientAccumulationScheduler(S{{1, 0}, {3, 4}}); }) ==
        lightning().at("bad_factor").at("message"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { GradientAccumulationScheduler(S{}); }),
             Catch::Contains("Empty dict cannot be interpreted correct"));
  auto loader = small_loader(8);
  {
    Small net;
    test::CpuTrainer<FloatPrecision, GradientAccumulationScheduler> trainer(
        test::quiet({.max_epochs = 1, .accumulate_grad_batches = 2}), GradientAccumulationScheduler({{1, 2}}));
    CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(net, loader); }),
               Catch::StartsWith("You have set `accumulate_grad_batches` and are using the "
                                 "`GradientAccumulationScheduler` callback. Either remove `accumulate_grad_batches` "
                                 "from the Trainer or remove the callback."));
    CHECK(trainer.config().accumulate_grad_batches == 2);  // the Trainer's own, untouched
  }
  {
    Manual net;
    test::CpuTrainer<FloatPrecision, GradientAccumulationScheduler> trainer(test::quiet({.max_epochs = 1}),
                                                                           GradientAccumulationScheduler({{1, 2}}));
    CHECK(test::message_of<MisconfigurationError>([&] { trainer.fit(net, loader); }) ==
          "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for manual "
          "optimization. Please remove the callback or switch to automatic optimization.");
  }
}

// ---- BackboneFinetuning -----------------------------------------------------------------------------

namespace {

struct FinetuneNetImpl : torch::nn::Module {
  FinetuneNetImpl()
      : backbone(register_module("backbone", torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8),
                                                                   torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(head(backbone->forward(b.input)), b.target);
  }
  // As Lightning's docs ask: an optimizer over the parameters that train from the start.
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    std::vector<at::Tensor> trainable;
    for (auto& p : parameters())
      if (p.requires_grad()) trainable.push_back(p);
    if (optimizer == 1) return std::make_unique<torch::optim::Adam>(trainable, 0.1);
    if (optimizer == 2) return std::make_unique<optim::FusedAdam>(trainable, torch::optim::AdamOptions(0.1));
    return std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Sequential backbone;
  torch::nn::Linear head;
  int optimizer = 0;  // SGD, Adam, FusedAdam
};
TORCH_MODULE(FinetuneNet);

/// Sets the main lr of each epoch (as a scheduler would), before BackboneFinetuning runs.
struct MainLr {
  std::string name;
  void on_train_epoch_start(TrainerView& trainer) {
    const double lr = number(name, "main" + std::to_string(trainer.current_epoch()));
    trainer.optimizers()[0].optimizer->param_groups().front().options().set_lr(lr);
  }
};

/// The optimizer's groups and last group lr at each epoch's start, after BackboneFinetuning, and the
/// backbone's and head's weights at each epoch's end.
struct Observer {
  std::map<std::int64_t, std::pair<std::size_t, double>> lrs;
  std::map<std::int64_t, std::pair<at::Tensor, at::Tensor>> weights;
  std::map<std::int64_t, at::Tensor> running_mean;
  std::map<std::int64_t, std::size_t> last_group_size;
  void on_train_epoch_start(TrainerView& trainer) {
    auto& groups = trainer.optimizers()[0].optimizer->param_groups();
    lrs[trainer.current_epoch()] = {groups.size(), groups.back().options().get_lr()};
    last_group_size[trainer.current_epoch()] = groups.back().params().size();
  }
  void on_train_epoch_end(TrainerView& trainer, torch::nn::Module& module) {
    const auto params = module.named_parameters();
    weights[trainer.current_epoch()] = {params["backbone.0.weight"].detach().clone(), params["head.weight"].detach().clone()};
    running_mean[trainer.current_epoch()] = module.named_buffers()["backbone.1.running_mean"].clone();
  }
};

}  // namespace

TEST_CASE("BackboneFinetuning: the lrs of each epoch are Lightning's BackboneFinetuning's", "[finetuning][backbone]") {
  struct Case {
    std::string name;
    BackboneFinetuningOptions options;
    std::int64_t epochs;
  };
  const std::vector<Case> cases{
      {"bb_default", {.unfreeze_backbone_at_epoch = 2}, 8},
      {"bb_custom",
       {.unfreeze_backbone_at_epoch = 1, .lambda_func = [](std::int64_t e) { return 1.0 + 0.1 * static_cast<double>(e); },
        .backbone_initial_lr = 0.003, .should_align = false},
       7},
      {"bb_align", {.unfreeze_backbone_at_epoch = 0, .lambda_func = [](std::int64_t) { return 1.7; }, .backbone_initial_ratio_lr = 0.3}, 6},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    torch::manual_seed(0);
    FinetuneNet net;
    test::CpuTrainer<FloatPrecision, MainLr, BackboneFinetuning, Observer> trainer(
        test::quiet({.max_epochs = c.epochs}), MainLr{c.name}, BackboneFinetuning(c.options), Observer{});
    auto loader = small_loader(8);
    trainer.fit(net, loader);
    const auto& lrs = trainer.callback<Observer>().lrs;
    for (std::int64_t epoch = 0; epoch < c.epochs; ++epoch) {
      INFO("epoch " << epoch);
      CHECK(lrs.at(epoch).first == std::stoull(lightning().at(c.name).at("groups" + std::to_string(epoch))));
      CHECK(lrs.at(epoch).second == number(c.name, "lr" + std::to_string(epoch)));  // bit for bit
    }
  }
}

TEST_CASE("BackboneFinetuning: verbose prints Lightning's lines, rounded as Python rounds", "[finetuning][backbone]") {
  torch::manual_seed(0);
  FinetuneNet net;
  test::CpuTrainer<FloatPrecision, MainLr, BackboneFinetuning> trainer(
      test::quiet({.max_epochs = 7}), MainLr{"bb_custom"},
      BackboneFinetuning({.unfreeze_backbone_at_epoch = 1,
                          .lambda_func = [](std::int64_t e) { return 1.0 + 0.1 * static_cast<double>(e); },
                          .backbone_initial_lr = 0.003, .should_align = false, .verbose = true, .rounding = 5}));
  auto loader = small_loader(8);
  std::ostringstream captured;
  std::streambuf* const original = std::cout.rdbuf(captured.rdbuf());
  try {
    trainer.fit(net, loader);
  } catch (...) {
    std::cout.rdbuf(original);
    throw;
  }
  std::cout.rdbuf(original);
  std::vector<std::string> printed;
  std::istringstream lines(captured.str());
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("Current lr:", 0) == 0) printed.push_back(line);
  const auto& expected = lightning().at("bb_verbose");
  REQUIRE(printed.size() == expected.size());
  for (std::size_t i = 0; i < printed.size(); ++i) CHECK(printed[i] == expected.at("line" + std::to_string(i)));
}

TEST_CASE("BackboneFinetuning: the backbone is frozen before its epoch and trains from it, BatchNorm as asked",
          "[finetuning][backbone]") {
  for (const bool train_bn : {true, false}) {
    INFO("train_bn " << train_bn);
    torch::manual_seed(0);
    FinetuneNet net;
    const at::Tensor initial = net->backbone[0]->as<torch::nn::Linear>()->weight.detach().clone();
    const at::Tensor running_mean = net->named_buffers()["backbone.1.running_mean"].clone();
    test::CpuTrainer<FloatPrecision, BackboneFinetuning, Observer> trainer(
        test::quiet({.max_epochs = 4}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 2, .train_bn = train_bn}), Observer{});
    auto loader = small_loader(16);
    trainer.fit(net, loader);
    const auto& w = trainer.callback<Observer>().weights;
    CHECK(torch::equal(w.at(0).first, initial));
    CHECK(torch::equal(w.at(1).first, initial));
    CHECK_FALSE(torch::equal(w.at(2).first, initial));
    CHECK_FALSE(torch::equal(w.at(3).first, w.at(2).first));
    CHECK_FALSE(torch::equal(w.at(1).second, w.at(0).second));  // the head trained all along
    CHECK(trainer.callback<Observer>().lrs.at(2).first == 2U);
    // BatchNorm: with train_bn it trains (and keeps statistics) all along; without, it is frozen with
    // the backbone (its statistics kept as they were, as Lightning's track_running_stats = False) and
    // left out of the backbone's param group (Lightning's filter_params).
    const auto& stats = trainer.callback<Observer>().running_mean;
    CHECK(torch::equal(stats.at(0), running_mean) == !train_bn);
    CHECK(torch::equal(stats.at(1), stats.at(0)) == !train_bn);
    CHECK_FALSE(torch::equal(stats.at(3), stats.at(2)));  // tracked again once unfrozen
    // Before: the head's group, with the BatchNorm's parameters when they train (train_bn). From the
    // unfreeze: the backbone's group, the Linear's two (a trainable BatchNorm is in the first group
    // already: skipped with Lightning's warning).
    CHECK(trainer.callback<Observer>().last_group_size.at(1) == (train_bn ? 4U : 2U));
    CHECK(trainer.callback<Observer>().last_group_size.at(2) == 2U);
  }
}

TEST_CASE("BackboneFinetuning: a frozen BatchNorm (train_bn = false) evaluates with its running statistics",
          "[finetuning][backbone]") {
  // PyTorch's frozen BatchNorm (track_running_stats = False) normalizes by the batch in training and by
  // its running statistics in evaluation; LibTorch's with track_running_stats off would use the batch in
  // both, so fulgur freezes it by its momentum instead.
  torch::manual_seed(0);
  FinetuneNet net;
  test::CpuTrainer<FloatPrecision, BackboneFinetuning> trainer(
      test::quiet({.max_epochs = 1}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 5, .train_bn = false}));
  auto loader = small_loader(16);
  const at::Tensor mean_before = net->named_buffers()["backbone.1.running_mean"].clone();
  trainer.fit(net, loader);
  auto bn = net->backbone[1]->as<torch::nn::BatchNorm1d>();
  REQUIRE(bn != nullptr);
  CHECK(torch::equal(bn->running_mean, mean_before));  // frozen: the statistics kept
  bn->running_mean.add_(0.5);                           // statistics that differ from any batch's
  bn->eval();
  const at::Tensor x = torch::randn({6, 8});
  torch::NoGradGuard no_grad;
  const at::Tensor expected = torch::batch_norm(x, bn->weight, bn->bias, bn->running_mean, bn->running_var,
                                                /*training=*/false, 0.1, bn->options.eps(), false);
  CHECK(torch::equal(bn->forward(x), expected));
}

TEST_CASE("BackboneFinetuning: a fit resumed after the unfreeze, inside an epoch, ends bit-identical",
          "[finetuning][backbone][checkpoint]") {
  const std::string folder = test::scratch_folder("backbone_resume");
  for (const int optimizer : {0, 1, 2}) {
    INFO("optimizer " << optimizer << " (SGD, Adam, FusedAdam)");
    const auto run = [&](bool save, const std::string& resume) {
      torch::manual_seed(0);
      FinetuneNet net;
      net->optimizer = optimizer;
      test::CpuTrainer<FloatPrecision, BackboneFinetuning, SaveAt, Observer> trainer(
          test::quiet({.max_epochs = 5}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 1}),
          SaveAt{save ? 2 : -1, 1, folder + "/mid.ckpt"}, Observer{});
      auto loader = small_loader(16);
      trainer.fit(net, loader, FitOptions{.ckpt_path = resume});
      return std::pair{trainer.callback<Observer>().lrs, test::snapshot(*net)};
    };
    const auto [straight_lrs, straight] = run(true, "");
    const auto [resumed_lrs, resumed] = run(false, folder + "/mid.ckpt");
    REQUIRE(straight.size() == resumed.size());
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i], resumed[i]));
    for (std::int64_t epoch = 2; epoch < 5; ++epoch) CHECK(resumed_lrs.at(epoch) == straight_lrs.at(epoch));
    CHECK(straight_lrs.at(4).second == 0.1 * 0.1 * 2 * 2 * 2);  // 0.01 at the unfreeze, doubled at epochs 2..4
  }
}

// The multi-rank checks (averaging, parity with one process, resume) are tests/distributed's
// backbone_finetuning; here, in a world of one, the layout the reducer ends with.
TEST_CASE("BackboneFinetuning under DDP: the reducer's buckets take the backbone in at the unfreeze",
          "[finetuning][backbone][distributed]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  for (const std::int64_t epochs : {1, 2}) {
    INFO(epochs << " epoch(s), unfrozen at epoch 1");
    torch::manual_seed(0);
    FinetuneNet net;
    const at::Tensor before = net->backbone->named_parameters()["0.weight"].detach().clone();
    fulgur::Trainer<CPUAccelerator, DDPStrategy, FloatPrecision, BackboneFinetuning> trainer(
        test::quiet({.max_epochs = epochs}), DDPOptions{}, BackboneFinetuning({.unfreeze_backbone_at_epoch = 1}));
    auto loader = small_loader(16);
    trainer.fit(net, loader);
    std::vector<std::string> names;
    for (const auto& bucket : trainer.strategy().reducer()->bucket_layout()) names.insert(names.end(), bucket.begin(), bucket.end());
    const bool backbone_in = std::find(names.begin(), names.end(), "backbone.0.weight") != names.end();
    CHECK(backbone_in == (epochs == 2));
    CHECK(std::find(names.begin(), names.end(), "head.weight") != names.end());
    CHECK(torch::equal(before, net->backbone->named_parameters()["0.weight"]) == (epochs == 1));
  }
}

namespace {
/// The backbone's group added under a scheduler made with the head's group alone.
struct ScheduledNetImpl : FinetuneNetImpl {
  explicit ScheduledNetImpl(std::string kind = "libtorch_step") : kind(std::move(kind)) {}
  OptimizerConfig configure_optimizers() {
    std::vector<at::Tensor> trainable;
    for (auto& p : parameters())
      if (p.requires_grad()) trainable.push_back(p);
    auto sgd = std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));
    OptimizerConfig config;
    if (kind == "libtorch_step") config.lr_scheduler = std::make_unique<torch::optim::StepLR>(*sgd, 1, 0.5);
    if (kind == "libtorch_plateau")
      config.lr_scheduler = std::make_unique<torch::optim::ReduceLROnPlateauScheduler>(*sgd);
    if (kind == "bbs_step") config.lr_scheduler = std::make_unique<optim::StepLR>(*sgd, 2, 0.5);
    if (kind == "bbs_cosine") config.lr_scheduler = std::make_unique<optim::CosineAnnealingLR>(*sgd, 8, 0.001);
    if (kind == "bbs_exp_steps") {
      config.lr_scheduler = std::make_unique<optim::ExponentialLR>(*sgd, 0.9);
      config.interval = SchedulerInterval::step;
    }
    if (kind == "bbs_lambda")
      config.lr_scheduler = std::make_unique<optim::LambdaLR>(
          *sgd, [](std::int64_t e) { return std::pow(0.9, static_cast<double>(e)); });
    if (kind == "libtorch_plateau") config.monitor = "train_loss";
    config.optimizer = std::move(sgd);
    return config;
  }
  std::string kind;
};
TORCH_MODULE(ScheduledNet);

/// Every group's lr at each epoch start: listed before BackboneFinetuning, the scheduler's; after, the callback's.
struct GroupLrs {
  std::map<std::int64_t, std::vector<double>> lrs;
  void on_train_epoch_start(TrainerView& trainer) {
    std::vector<double>& out = lrs[trainer.current_epoch()];
    for (const auto& group : trainer.optimizers()[0].optimizer->param_groups()) out.push_back(group.options().get_lr());
  }
};
/// The reference's "<lr> <lr> ..." (Python's repr, which reads back to the same double).
std::vector<double> numbers(const std::string& c, const std::string& key) {
  std::istringstream in(lightning().at(c).at(key));
  std::vector<double> out;
  for (std::string word; in >> word;) out.push_back(std::strtod(word.c_str(), nullptr));
  return out;
}
struct SchedulerLrs : GroupLrs {};
struct CallbackLrs : GroupLrs {};
}  // namespace

TEST_CASE("BackboneFinetuning with a fulgur::optim scheduler: every group's lr at each epoch is Lightning's",
          "[finetuning][backbone][scheduler]") {
  // Lightning's BackboneFinetuning adds the backbone's group under the scheduler made in configure_optimizers:
  // StepLR and CosineAnnealingLR (per epoch) and ExponentialLR (per step) scale it with the head's group from
  // then on, and the callback sets it again at each epoch start (tests/unit/finetuning_reference.py).
  struct Case {
    std::string name;
    BackboneFinetuningOptions options;
    std::int64_t epochs;
  };
  const std::vector<Case> cases{
      {"bbs_step", {.unfreeze_backbone_at_epoch = 2}, 8},
      {"bbs_cosine", {.unfreeze_backbone_at_epoch = 3, .lambda_func = [](std::int64_t) { return 1.5; }}, 8},
      {"bbs_exp_steps", {.unfreeze_backbone_at_epoch = 1, .should_align = false}, 5},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    torch::manual_seed(0);
    ScheduledNet net(c.name);
    test::CpuTrainer<FloatPrecision, SchedulerLrs, BackboneFinetuning, CallbackLrs> trainer(
        test::quiet({.max_epochs = c.epochs}), SchedulerLrs{}, BackboneFinetuning(c.options), CallbackLrs{});
    auto loader = small_loader(8);  // 2 batches an epoch, as the reference steps
    trainer.fit(net, loader);
    for (std::int64_t epoch = 0; epoch < c.epochs; ++epoch) {
      INFO("epoch " << epoch);
      // bit for bit
      CHECK(trainer.callback<SchedulerLrs>().lrs.at(epoch) == numbers(c.name, "pre" + std::to_string(epoch)));
      CHECK(trainer.callback<CallbackLrs>().lrs.at(epoch) == numbers(c.name, "lrs" + std::to_string(epoch)));
    }
  }
}

TEST_CASE("BackboneFinetuning with a LambdaLR: PyTorch's fails at the step after the unfreeze, fulgur's there too",
          "[finetuning][backbone][scheduler][errors]") {
  // LambdaLR's lrs are base_lr * f(epoch), one base_lr per group it was made with: the backbone's has none.
  torch::manual_seed(0);
  ScheduledNet net("bbs_lambda");
  test::CpuTrainer<FloatPrecision, BackboneFinetuning, CallbackLrs> trainer(
      test::quiet({.max_epochs = 6}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 2}), CallbackLrs{});
  auto loader = small_loader(8);
  const std::string message = test::message_of<MisconfigurationError>([&] { trainer.fit(net, loader); });
  CHECK_THAT(message, Catch::StartsWith("LambdaLR: the optimizer has 2 param groups and this scheduler's schedule "
                                        "holds 1, those it was made with"));
  CHECK_THAT(message, Catch::Contains("Make the scheduler after the last add_param_group"));
  const std::string raised = lightning().at("bbs_lambda").at("raised");  // "<epoch> ValueError: ..."
  const auto& lrs = trainer.callback<CallbackLrs>().lrs;
  REQUIRE_FALSE(lrs.empty());
  CHECK(std::to_string(lrs.rbegin()->first) == raised.substr(0, raised.find(' ')));  // the epoch it stopped in
  CHECK_THAT(message, Catch::Contains(raised.substr(raised.find("ValueError: ") + 12)));
  for (const auto& [epoch, values] : lrs) CHECK(values == numbers("bbs_lambda", "lrs" + std::to_string(epoch)));
}

TEST_CASE("BackboneFinetuning with a StepLR: a fit resumed after the unfreeze, inside an epoch, ends bit-identical",
          "[finetuning][backbone][scheduler][checkpoint]") {
  // The scheduler's state saved with two groups (base_lrs one, _last_lr two) is loaded after the callback
  // added the backbone's group again.
  const std::string folder = test::scratch_folder("backbone_scheduler_resume");
  for (const std::string kind : {"bbs_step", "bbs_exp_steps"}) {
    INFO(kind);
    const auto run = [&](bool save, const std::string& resume) {
      torch::manual_seed(0);
      ScheduledNet net(kind);
      test::CpuTrainer<FloatPrecision, BackboneFinetuning, SaveAt, CallbackLrs> trainer(
          test::quiet({.max_epochs = 5}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 1}),
          SaveAt{save ? 2 : -1, 0, folder + "/mid.ckpt"}, CallbackLrs{});
      auto loader = small_loader(16);
      trainer.fit(net, loader, FitOptions{.ckpt_path = resume});
      return std::pair{trainer.callback<CallbackLrs>().lrs, test::snapshot(*net)};
    };
    const auto [straight_lrs, straight] = run(true, "");
    const auto [resumed_lrs, resumed] = run(false, folder + "/mid.ckpt");
    REQUIRE(straight.size() == resumed.size());
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i], resumed[i]));
    for (std::int64_t epoch = 3; epoch < 5; ++epoch) CHECK(resumed_lrs.at(epoch) == straight_lrs.at(epoch));
  }
}

TEST_CASE("BackboneFinetuning whose unfreeze epoch is past max_epochs warns once (probe)", "[finetuning][backbone]") {
  // Found by the probe: unfreeze_backbone_at_epoch = 5 with max_epochs = 5 trained the head alone, silently.
  for (const std::int64_t unfreeze : {4, 5, 9}) {
    INFO("unfreeze at " << unfreeze);
    torch::manual_seed(0);
    FinetuneNet net;
    test::CpuTrainer<FloatPrecision, BackboneFinetuning> trainer(
        test::quiet({.max_epochs = 5}), BackboneFinetuning({.unfreeze_backbone_at_epoch = unfreeze}));
    auto loader = small_loader(8);
    const FitResult result = trainer.fit(net, loader);
    const auto count = std::count_if(result.warnings.begin(), result.warnings.end(), [](const std::string& w) {
      return w.find("the backbone stays frozen for the whole fit") != std::string::npos;
    });
    CHECK(count == (unfreeze >= 5 ? 1 : 0));
  }
}

TEST_CASE("BackboneFinetuning: bad options, modules without a backbone, an lr scheduler", "[finetuning][backbone][errors]") {
  CHECK_THAT(test::message_of<MisconfigurationError>([] { BackboneFinetuning({.unfreeze_backbone_at_epoch = -1}); }),
             Catch::Contains("unfreeze_backbone_at_epoch must be >= 0"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { BackboneFinetuning({.backbone_initial_lr = 0.0}); }),
             Catch::Contains("backbone_initial_lr must be > 0"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { BackboneFinetuning({.lambda_func = nullptr}); }),
             Catch::Contains("lambda_func is empty"));
  auto loader = small_loader(8);
  Small net;  // fc1, fc2: no backbone
  test::CpuTrainer<FloatPrecision, BackboneFinetuning> trainer(test::quiet({.max_epochs = 1}), BackboneFinetuning());
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(net, loader); }),
             Catch::StartsWith("The LightningModule should have a nn.Module `backbone` attribute"));
  test::CpuTrainer<FloatPrecision, BackboneFinetuning> named(test::quiet({.max_epochs = 1}),
                                                            BackboneFinetuning({.backbone = "encoder"}));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { named.fit(net, loader); }),
             Catch::Contains("has no submodule named `encoder`"));
  // A backbone named in the options: fc1 here.
  torch::manual_seed(0);
  Small other;
  const at::Tensor before = other->fc1->weight.detach().clone();
  test::CpuTrainer<FloatPrecision, BackboneFinetuning> by_name(test::quiet({.max_epochs = 1}),
                                                              BackboneFinetuning({.backbone = "fc1"}));
  by_name.fit(other, loader);
  CHECK(torch::equal(other->fc1->weight, before));
  // LibTorch's StepLR scales every group, the backbone's too: it runs. Its ReduceLROnPlateauScheduler would
  // read past its per-group min_lrs: refused before training.
  ScheduledNet scheduled("libtorch_step");
  test::CpuTrainer<FloatPrecision, BackboneFinetuning, CallbackLrs> with_scheduler(
      test::quiet({.max_epochs = 2}), BackboneFinetuning({.unfreeze_backbone_at_epoch = 1}), CallbackLrs{});
  with_scheduler.fit(scheduled, loader);
  CHECK(with_scheduler.callback<CallbackLrs>().lrs.at(1).size() == 2U);  // the backbone's group from epoch 1
  ScheduledNet plateau("libtorch_plateau");
  test::CpuTrainer<FloatPrecision, BackboneFinetuning> with_plateau(test::quiet({.max_epochs = 2}),
                                                                   BackboneFinetuning());
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { with_plateau.fit(plateau, loader); }),
             Catch::Contains("BackboneFinetuning cannot run with LibTorch's torch::optim::ReduceLROnPlateauScheduler"));
}
