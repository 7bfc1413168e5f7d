// The loops' rules beyond parity: the config checked when the Trainer is built, limits and
// validation placement, stop requests, max_time, manual optimization, schedulers, validate/test/
// predict, logging errors, exceptions, and the regressions found by trying fulgur as a new user.
#include <ATen/autocast_mode.h>
#include <catch2/catch.hpp>
#include <unistd.h>

#include "unit/support.hpp"

using namespace fulgur;
using test::CpuTrainer;

namespace {
data::TensorLoader loader(std::int64_t samples, std::int64_t batch_size = 8, std::uint64_t seed = 0) {
  auto [x, y] = test::classification_data(samples, seed);
  return data::TensorLoader(x, y, {.batch_size = batch_size});
}

/// Counts validation runs and records what the test wants to see.
struct ProbeImpl : test::ClassifierImpl {
  void on_validation_start() { ++validations; }
  void on_train_epoch_end(StepContext& ctx) { epochs_seen.push_back(ctx.current_epoch); }
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    if (stop_at && *stop_at == std::pair{ctx.current_epoch, i}) ctx.should_stop = true;
    const auto loss = ClassifierImpl::training_step(b, i);
    return ctx.global_step == nan_at_step ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
  }
  int validations = 0;
  std::vector<std::int64_t> epochs_seen;
  std::optional<std::pair<std::int64_t, std::int64_t>> stop_at;
  std::int64_t nan_at_step = -1;
};
TORCH_MODULE(Probe);
}  // namespace

TEST_CASE("config: a value that cannot work names the field and the fix when the Trainer is built", "[loops][config]") {
  auto refused = [](TrainerConfig config) {
    return test::message_of<MisconfigurationError>([&] { CpuTrainer<FloatPrecision> trainer(test::quiet(config)); });
  };
  CHECK(refused({.max_steps = -5}) == "TrainerConfig::max_steps must be >= -1 (-1: no limit), got -5.");
  CHECK(refused({.accumulate_grad_batches = 0}) == "TrainerConfig::accumulate_grad_batches must be >= 1, got 0.");
  CHECK_THAT(refused({.limit_train_batches = 1.5}),
             Catch::StartsWith("TrainerConfig::limit_train_batches as a fraction of the batches must lie in [0, 1]"));
  CHECK_THAT(refused({.limit_val_batches = -2}), Catch::StartsWith("TrainerConfig::limit_val_batches as a number"));
  CHECK_THAT(refused({.val_check_interval = 0}), Catch::StartsWith("TrainerConfig::val_check_interval as a number"));
  CHECK_THAT(refused({.val_check_interval = 1.25}), Catch::Contains("must lie in (0, 1]"));
  CHECK_THAT(refused({.val_check_interval = 0.5, .check_val_every_n_epoch = std::nullopt}),
             Catch::Contains("must be an integer (a number of batches) when check_val_every_n_epoch is unset"));
  CHECK(refused({.num_sanity_val_steps = -2}) ==
        "TrainerConfig::num_sanity_val_steps must be >= -1 (-1: all validation batches), got -2.");
  CHECK(refused({.check_val_every_n_epoch = 0}) == "TrainerConfig::check_val_every_n_epoch must be >= 1, got 0.");
  CHECK(refused({.max_time = std::chrono::seconds(-1)}) ==
        "TrainerConfig::max_time must be a duration >= 0 (unset: no limit), got -1 s.");
  // NaN compared false with the clock: it trained without any limit (probe 8).
  CHECK(refused({.max_time = std::chrono::duration<double>(std::nan(""))}) ==
        "TrainerConfig::max_time must be a duration >= 0 (unset: no limit), got nan s.");
  CHECK(refused({.log_every_n_steps = 0}) == "TrainerConfig::log_every_n_steps must be >= 1, got 0.");
  // Checked before any policy is built: under DDP a bad num_nodes is named as such, not as a launch mismatch.
  CHECK(test::message_of<MisconfigurationError>([] {
          Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(test::quiet({.num_nodes = 0}));
        }) == "TrainerConfig::num_nodes must be >= 1, got 0.");
  // Several at once: all named in one error, in TrainerConfig's order (a config with three mistakes is one run).
  CHECK(refused({.max_epochs = -3, .max_steps = -5, .val_check_interval = 0, .log_every_n_steps = 0}) ==
        "TrainerConfig has 4 problems:\n"
        "  TrainerConfig::max_epochs must be >= -1 (-1: no limit), got -3.\n"
        "  TrainerConfig::max_steps must be >= -1 (-1: no limit), got -5.\n"
        "  TrainerConfig::val_check_interval as a number of training batches must be >= 1, got 0.\n"
        "  TrainerConfig::log_every_n_steps must be >= 1, got 0.");
}

TEST_CASE("config: devices = -1 is all devices on every accelerator, preemption.exit_code 0 is refused (probe)",
          "[loops][config]") {
  // Found by the new-user probe: TrainerConfig's check offered -1 ("for all") and CPUAccelerator refused it.
  CHECK(CPUAccelerator::parse_devices(-1) == std::vector<int>{0});
  CHECK(CPUAccelerator::parse_devices("-1") == std::vector<int>{0});
  auto train = loader(16);
  Probe model;
  CHECK(CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .devices = -1})).fit(model, train).global_step == 2);
  CHECK(CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .devices = "-1"})).fit(model, train).global_step == 2);
  // What the check offers for 0 is what the accelerator takes.
  const auto zero = test::message_of<MisconfigurationError>([] { CpuTrainer<FloatPrecision> t(test::quiet({.devices = 0})); });
  CHECK_THAT(zero, Catch::Contains("-1 for all") && Catch::Contains("with CUDAAccelerator a list"));  // the CPU takes none
  CHECK_THAT(test::message_of<MisconfigurationError>([] { CPUAccelerator::parse_devices(-2); }),
             Catch::StartsWith("`devices` selected with `CPUAccelerator` should be an int > 0 (or -1 for all, which on "
                               "the CPU is 1 process), got -2."));
  // exit_code 0 says "succeeded": a preempted job would never be requeued. Named with the usual value.
  auto refused = [](int code) {
    return test::message_of<MisconfigurationError>(
        [&] { CpuTrainer<FloatPrecision> trainer(test::quiet({.preemption = {.exit_code = code}})); });
  };
  CHECK_THAT(refused(0), Catch::StartsWith("TrainerConfig::preemption.exit_code must lie in [1, 255] and not mean success"));
  CHECK_THAT(refused(0), Catch::Contains("keep the default 75 (EX_TEMPFAIL") && Catch::EndsWith("got 0."));
  CHECK_THAT(refused(256), Catch::EndsWith("got 256."));  // the exit status is 256 % 256 = 0
  CHECK_THAT(refused(-1), Catch::EndsWith("got -1."));
  CHECK_NOTHROW(CpuTrainer<FloatPrecision>(test::quiet({.preemption = {.exit_code = 143}})));
}

TEST_CASE("limits: counts and fractions of the batches, as Lightning computes them", "[loops][limits]") {
  auto train = loader(64);  // 8 batches
  Probe model;
  CHECK(CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .limit_train_batches = 0.5})).fit(model, train).global_step == 4);
  CHECK(CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .limit_train_batches = 3})).fit(model, train).global_step == 3);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .limit_train_batches = 0.1})).fit(model, train);
             }),
             Catch::Contains("0.1 * 8 < 1. Please increase the `limit_train_batches` argument. Try at least "
                             "`limit_train_batches=0.125"));
  // limit_train_batches = 0: no training at all (Lightning's skip), and no error; the reason says why (probe)
  const auto none = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 3, .limit_train_batches = 0})).fit(model, train);
  CHECK(none.global_step == 0);
  CHECK(none.epochs.empty());
  CHECK(none.stop_reason == "no training batches (limit_train_batches=0)");
}

TEST_CASE("validation placement: fractions, counts, across epochs, every n epochs, and the sanity check",
          "[loops][validation]") {
  auto train = loader(64);  // 8 batches
  auto val = loader(16);
  auto validations = [&](TrainerConfig config) {
    Probe model;
    CpuTrainer<FloatPrecision>(test::quiet(config)).fit(model, train, val);
    return model->validations;
  };
  CHECK(validations({.max_epochs = 2, .num_sanity_val_steps = 0}) == 2);
  CHECK(validations({.max_epochs = 2}) == 3);  // + the sanity check
  CHECK(validations({.max_epochs = 2, .val_check_interval = 0.25, .num_sanity_val_steps = 0}) == 8);
  CHECK(validations({.max_epochs = 2, .val_check_interval = 3, .num_sanity_val_steps = 0}) == 4);  // batches 3, 6
  // counted across epochs: batches 5, 10, 15 of 16
  CHECK(validations({.max_epochs = 2, .val_check_interval = 5, .check_val_every_n_epoch = std::nullopt,
                     .num_sanity_val_steps = 0}) == 3);
  CHECK(validations({.max_epochs = 4, .check_val_every_n_epoch = 2, .num_sanity_val_steps = 0}) == 2);
  CHECK(validations({.max_epochs = 2, .limit_val_batches = 0}) == 0);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { validations({.max_epochs = 1, .val_check_interval = 9}); }),
             Catch::StartsWith("`val_check_interval` (9) must be less than or equal to the number of the training "
                               "batches (8)."));
}

TEST_CASE("stopping: should_stop honours min_epochs, max_time stops at a batch, the reason is given", "[loops][stop]") {
  auto train = loader(64);
  {
    Probe model;
    model->stop_at = std::pair<std::int64_t, std::int64_t>{0, 2};
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5})).fit(model, train);
    CHECK(r.global_step == 3);
    CHECK(r.stop_reason == "should_stop was set");
  }
  {
    Probe model;
    model->stop_at = std::pair<std::int64_t, std::int64_t>{0, 2};
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5, .min_epochs = 2})).fit(model, train);
    CHECK(model->epochs_seen == std::vector<std::int64_t>{0, 1});  // the request waits for min_epochs
    CHECK(r.global_step == 16);                                    // then ends before the next epoch
  }
  {
    Probe model;
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5, .max_time = std::chrono::seconds(0)}))
                       .fit(model, train);
    CHECK(r.global_step == 1);
    CHECK_THAT(r.stop_reason, Catch::StartsWith("max_time=0 s reached"));
  }
  {
    Probe model;  // the limit as written, not rounded to 0.0000 (probe 8)
    const auto r =
        CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5, .max_time = std::chrono::microseconds(1)})).fit(model, train);
    CHECK_THAT(r.stop_reason, Catch::StartsWith("max_time=1e-06 s reached"));
  }
  {
    Probe model;
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 2})).fit(model, train);
    CHECK(r.stop_reason == "max_epochs=2 reached");
    CHECK(r.warnings.empty());
  }
  {  // a minimum the maximum cuts short is said (probe 7: Lightning is silent), once per limit
    Probe model;
    const auto r =
        CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .min_epochs = 3, .max_steps = 4, .min_steps = 6}))
            .fit(model, train);
    CHECK(r.stop_reason == "max_steps=4 reached");
    CHECK(r.warnings == std::vector<std::string>{
                            "fulgur: TrainerConfig::min_epochs = 3 is more than TrainerConfig::max_epochs = 1: fit stops "
                            "at max_epochs, so the minimum is not reached. Lower min_epochs or raise max_epochs.",
                            "fulgur: TrainerConfig::min_steps = 6 is more than TrainerConfig::max_steps = 4: fit stops "
                            "at max_steps, so the minimum is not reached. Lower min_steps or raise max_steps."});
  }
  {  // max_epochs unset: its default is named as that
    Probe model;
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.min_epochs = 1001, .limit_train_batches = 1})).fit(model, train);
    CHECK(r.warnings == std::vector<std::string>{
                            "fulgur: TrainerConfig::min_epochs = 1001 is more than TrainerConfig::max_epochs (unset: "
                            "1000): fit stops at max_epochs, so the minimum is not reached. Lower min_epochs or raise "
                            "max_epochs."});
  }
}

// ---- regressions found by trying fulgur as a new user would ---------------------------------------

TEST_CASE("regression: max_steps ending inside an epoch reports that epoch's loss and checks it", "[loops][regression]") {
  auto [x, y] = test::classification_data(80);  // 10 batches of 8
  {
    data::TensorLoader clean(x, y, {.batch_size = 8});
    Probe model;
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_steps = 15})).fit(model, clean);
    REQUIRE(r.epochs.size() == 2);
    REQUIRE(r.epochs[1].train_loss.has_value());  // was reported as 0.0000
    CHECK(*r.epochs[1].train_loss > 0.0);
    CHECK(r.metrics.at("train_loss") == *r.epochs[1].train_loss);
  }
  {
    Probe model;  // the loss at global_step 12 (epoch 1, batch 2) turns everything NaN
    model->nan_at_step = 12;
    data::TensorLoader clean(x, y, {.batch_size = 8});
    const auto message = test::message_of<NonFiniteLossError>(
        [&] { CpuTrainer<FloatPrecision>(test::quiet({.max_steps = 15})).fit(model, clean); });  // was a success
    CHECK_THAT(message, Catch::StartsWith("fulgur: the loss is NaN at training_step at epoch 1, batch 4 (global_step 14)"));
    CHECK_THAT(message, Catch::Contains("last seen finite at global_step 9"));
  }
}

TEST_CASE("regression: validate() on a fresh module under 64-true and bf16-true converts the module too",
          "[loops][regression]") {
  auto val = loader(32);
  {
    test::Classifier model;
    const auto r = CpuTrainer<DoublePrecision>(test::quiet()).validate(model, val);
    CHECK(model->fc1->weight.scalar_type() == at::kDouble);
    CHECK(std::isfinite(*r.loss));
  }
  {
    test::Classifier model;
    const auto r = CpuTrainer<BF16TruePrecision>(test::quiet()).test(model, val);
    CHECK(model->fc1->weight.scalar_type() == at::kBFloat16);
    CHECK(std::isfinite(r.metrics.at("test_loss")));
  }
}

namespace {
struct AlwaysNaNImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i) {
    return ClassifierImpl::training_step(b, i) * std::numeric_limits<float>::quiet_NaN();
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t i) { return training_step(b, i); }
};
TORCH_MODULE(AlwaysNaN);
}  // namespace

TEST_CASE("regression: under 16-mixed a loss that stays NaN ends the run after the configured skipped steps",
          "[loops][regression]") {
  auto train = loader(160);  // 20 batches
  {
    AlwaysNaN model;  // used to skip 17 of 20 steps (scale 65536 -> 0.5) and end as a success
    const auto message = test::message_of<NonFiniteLossError>(
        [&] { CpuTrainer<FP16MixedPrecision>(test::quiet({.max_epochs = 1, .max_consecutive_skipped_steps = 5})).fit(model, train); });
    CHECK_THAT(message, Catch::StartsWith("fulgur: the loss scaler skipped 5 optimizer steps in a row (inf/NaN "
                                          "gradients every time), the last at training_step at epoch 0, batch 4 "
                                          "(global_step 4) under precision '16-mixed'"));
    CHECK_THAT(message, Catch::Contains("raise TrainerConfig::max_consecutive_skipped_steps"));
  }
  {
    AlwaysNaN model;  // 0: never stop, every step skipped and counted
    const auto r = CpuTrainer<FP16MixedPrecision>(test::quiet({.max_epochs = 1, .max_consecutive_skipped_steps = 0}))
                       .fit(model, train);
    CHECK(r.skipped_optimizer_steps == 20);
  }
}

TEST_CASE("regression: a NaN validation loss is reported", "[loops][regression]") {
  struct NaNValidationImpl : test::ClassifierImpl {
    at::Tensor validation_step(const data::Batch& b, std::int64_t i) {
      return ClassifierImpl::validation_step(b, i) * std::numeric_limits<float>::quiet_NaN();
    }
  };
  auto model = std::make_shared<NaNValidationImpl>();
  const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0}))
                     .fit(model, loader(32), loader(16));
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::StartsWith("fulgur: the validation loss is NaN at epoch 0 (global_step 4)"));
  CHECK(std::isnan(*r.epochs[0].val_loss));
}

TEST_CASE("regression: fit, validate, test and predict take temporaries", "[loops][regression]") {
  auto [x, y] = test::classification_data(32);
  CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  test::Classifier model;
  CHECK(trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8}), data::TensorLoader(x, y, {.batch_size = 8}))
            .global_step == 4);
  CHECK(trainer.fit(test::Classifier(), std::vector<data::Batch>{{x, y}}).global_step == 1);
  CHECK(trainer.validate(model, data::TensorLoader(x, y)).loss.has_value());
}

// ---- manual optimization and several optimizers ---------------------------------------------------

namespace {
/// A GAN in miniature: a generator maps noise to 2-d points, a discriminator tells them from data
/// drawn around (2, -1). Two optimizers, stepped by the module itself.
struct TinyGanImpl : torch::nn::Module {
  static constexpr bool automatic_optimization = false;
  TinyGanImpl()
      : generator(register_module("generator", torch::nn::Linear(2, 2))),
        discriminator(register_module("discriminator", torch::nn::Linear(2, 1))) {}
  void training_step(const data::Batch& batch, std::int64_t, StepContext& ctx) {
    auto& d_opt = ctx.optimizer(0);
    auto& g_opt = ctx.optimizer(1);
    const auto bce = [](const at::Tensor& logits, double target) {
      return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
    };
    const auto fake = generator(torch::randn({batch.input.size(0), 2}));
    ctx.toggle_optimizer(d_opt);
    CHECK_FALSE(generator->weight.requires_grad());  // only the discriminator learns here
    const auto d_loss = bce(discriminator(batch.input), 1.0) + bce(discriminator(fake.detach()), 0.0);
    d_opt.zero_grad();
    ctx.manual_backward(d_loss);
    d_opt.step();
    ctx.untoggle_optimizer(d_opt);
    ctx.toggle_optimizer(g_opt);
    const auto g_loss = bce(discriminator(generator(torch::randn({batch.input.size(0), 2}))), 1.0);
    g_opt.zero_grad();
    ctx.manual_backward(g_loss);
    ctx.clip_gradients(g_opt, {.max_norm = 10.0});
    g_opt.step();
    ctx.untoggle_optimizer(g_opt);
    ctx.log("d_loss", d_loss, {.prog_bar = true});
    ctx.log("g_loss", g_loss);
    if (auto* scheduler = ctx.lr_schedulers()[1]; *scheduler) scheduler->step();
  }
  std::vector<OptimizerConfig> configure_optimizers() {
    std::vector<OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::Adam>(discriminator->parameters(), 1e-2)});
    auto g = std::make_unique<torch::optim::Adam>(generator->parameters(), 1e-2);
    auto schedule = std::make_unique<torch::optim::StepLR>(*g, /*step_size=*/1000, /*gamma=*/0.5);
    configs.push_back({std::move(g), std::move(schedule)});
    return configs;
  }
  torch::nn::Linear generator, discriminator;
};
TORCH_MODULE(TinyGan);
}  // namespace

TEST_CASE("manual optimization: two optimizers stepped by the module, each step counted", "[loops][manual]") {
  torch::manual_seed(0);
  const auto real = torch::randn({256, 2}) * 0.1 + torch::tensor({2.0f, -1.0f});
  data::TensorLoader train(real, torch::zeros({256}), {.batch_size = 32, .shuffle = true});
  TinyGan gan;
  const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 30})).fit(gan, train);
  CHECK(r.global_step == 30 * 8 * 2);  // Lightning counts every optimizer's steps
  CHECK(r.metrics.count("d_loss") == 1);
  CHECK(r.progress_bar_metrics.count("d_loss") == 1);
  torch::NoGradGuard no_grad;
  const auto generated = gan->generator(torch::randn({512, 2})).mean(0);
  CHECK(generated[0].item<double>() == Approx(2.0).margin(0.5));  // the generator learnt where the data is
  CHECK(generated[1].item<double>() == Approx(-1.0).margin(0.5));
  CHECK(gan->generator->weight.requires_grad());  // untoggled
  // Lightning's refusals for manual optimization, named with the fix
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { CpuTrainer<FloatPrecision>(test::quiet({.accumulate_grad_batches = 2})).fit(gan, train); }),
             Catch::StartsWith("Automatic gradient accumulation is not supported for manual optimization."));
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { CpuTrainer<FloatPrecision>(test::quiet({.gradient_clip_val = 1.0})).fit(gan, train); }),
             Catch::StartsWith("Automatic gradient clipping is not supported for manual optimization."));
}

TEST_CASE("several optimizers under automatic optimization are refused with Lightning's reason", "[loops][manual]") {
  struct TwoOptimizersImpl : test::ClassifierImpl {
    std::vector<OptimizerConfig> configure_optimizers() {
      std::vector<OptimizerConfig> configs;
      configs.push_back({std::make_unique<torch::optim::SGD>(fc1->parameters(), 0.1)});
      configs.push_back({std::make_unique<torch::optim::SGD>(fc2->parameters(), 0.1)});
      return configs;
    }
  };
  auto model = std::make_shared<TwoOptimizersImpl>();
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1})).fit(model, loader(16)); }),
             Catch::StartsWith("Training with multiple optimizers is only supported with manual optimization."));
  CHECK_THAT(test::message_of<MisconfigurationError>([] {
               StepContext ctx;
               ctx.optimizers();
             }),
             Catch::Contains("is for manual optimization: declare `static constexpr bool automatic_optimization = false;`"));
}

// ---- schedulers -----------------------------------------------------------------------------------

namespace {
struct PlateauImpl : test::ClassifierImpl {
  PlateauImpl() : ClassifierImpl(8, 16, 3, /*use_sgd=*/true, /*lr=*/0.0) {}  // lr 0: the loss never improves
  OptimizerConfig configure_optimizers() {
    auto sgd = std::make_unique<torch::optim::SGD>(parameters(), 1.0);
    optimizer = sgd.get();
    auto plateau = std::make_unique<torch::optim::ReduceLROnPlateauScheduler>(
        *sgd, torch::optim::ReduceLROnPlateauScheduler::min, /*factor=*/0.5, /*patience=*/0);
    return {.optimizer = std::move(sgd), .lr_scheduler = std::move(plateau), .monitor = monitor, .strict = strict};
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t i) { return ClassifierImpl::training_step(b, i) * 0.0; }
  void on_train_end() { final_lr = optimizer->param_groups()[0].options().get_lr(); }  // fit owns the optimizer
  torch::optim::Optimizer* optimizer = nullptr;
  double final_lr = 0.0;
  std::string monitor = "val_loss";
  bool strict = true;
};
TORCH_MODULE(Plateau);
}  // namespace

TEST_CASE("ReduceLROnPlateau steps on its monitored metric, a metric never logged is named", "[loops][scheduler]") {
  auto train = loader(32);
  auto val = loader(16);
  {
    Plateau model;  // val_loss never improves: patience 0 halves the lr after the first epoch that fails to improve
    CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 3, .num_sanity_val_steps = 0})).fit(model, train, val);
    CHECK(model->final_lr == 0.25);
  }
  {
    Plateau model;
    model->monitor = "val_acc";
    CHECK_THAT(test::message_of<MisconfigurationError>([&] {
                 CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0})).fit(model, train, val);
               }),
               Catch::StartsWith("ReduceLROnPlateau conditioned on metric val_acc which is not available. Available "
                                 "metrics are: [") &&
                   Catch::Contains("'val_loss'"));
  }
  {  // not strict: skipped with a warning, said once, not once per epoch (the new-user probe saw 3 copies)
    Plateau model;
    model->monitor = "val_acc";
    model->strict = false;
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 3, .num_sanity_val_steps = 0})).fit(model, train, val);
    REQUIRE(r.warnings.size() == 1);
    CHECK_THAT(r.warnings[0], Catch::Contains("val_acc"));
    CHECK(model->final_lr == 1.0);
  }
}

// ---- test and predict --------------------------------------------------------------------------

TEST_CASE("predict: the predictions, on the CPU, in order, in the default dtype", "[loops][predict]") {
  struct PredictorImpl : test::ClassifierImpl {
    at::Tensor predict_step(const data::Batch& b, std::int64_t) { return forward(b.input); }
  };
  auto model = std::make_shared<PredictorImpl>();
  auto [x, y] = test::classification_data(20);
  data::TensorLoader data(x, y, {.batch_size = 8});
  CpuTrainer<BF16TruePrecision> trainer(test::quiet({.limit_predict_batches = 2}));
  const std::vector<at::Tensor> predictions = trainer.predict(model, data);
  REQUIRE(predictions.size() == 2);
  CHECK(predictions[0].sizes() == at::IntArrayRef({8, 3}));
  CHECK(predictions[0].scalar_type() == at::kFloat);  // converted back from bfloat16
  CHECK(predictions[0].device().is_cpu());
  torch::NoGradGuard no_grad;
  const auto expected = model->forward(x.narrow(0, 8, 8).to(at::kBFloat16)).to(at::kFloat);
  CHECK(torch::equal(predictions[1], expected));  // the second batch, in order
  CHECK(model->is_training());                     // back to its mode after predicting
}

// ---- logging rules, exceptions -----------------------------------------------------------------

TEST_CASE("logging: where a hook may not log, on_step in an epoch hook, two different calls", "[loops][logging]") {
  struct LogsInFitStartImpl : test::ClassifierImpl {
    void on_fit_start(StepContext& ctx) { ctx.log("x", 1.0); }
  };
  struct StepInEpochHookImpl : test::ClassifierImpl {
    void on_train_epoch_end(StepContext& ctx) { ctx.log("x", 1.0, {.on_step = true}); }
  };
  struct TwoWaysImpl : test::ClassifierImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
      ctx.log("x", 1.0, {.prog_bar = i % 2 == 0});
      return ClassifierImpl::training_step(b, i);
    }
  };
  CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  auto train = loader(16);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(std::make_shared<LogsInFitStartImpl>(), train); }),
             Catch::StartsWith("You can't `log()` inside `on_fit_start`"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(std::make_shared<StepInEpochHookImpl>(), train); }),
             Catch::StartsWith("You can't log \"x\" with on_step = true in `on_train_epoch_end`"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(std::make_shared<TwoWaysImpl>(), train); }),
             Catch::StartsWith("You called `log(\"x\", ...)` twice in `training_step` with different arguments."));
}

namespace {
/// Logs its loss and a tensor of its own each step, and keeps what it logged and what it read back.
struct KeepsLoggedImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    at::Tensor loss = ClassifierImpl::training_step(b, i);
    ctx.log("loss", loss);
    at::Tensor mine = at::full({}, static_cast<double>(i), at::kFloat);
    ctx.log("index", mine);
    logged.push_back(mine);
    return loss;
  }
  std::vector<at::Tensor> logged;
};
TORCH_MODULE(KeepsLogged);

struct ReadsBack {
  std::vector<at::Tensor>* read;
  template <class Output>
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t) {
    read->push_back(*trainer.callback_metrics().find("index"));
    const at::Tensor loss = *trainer.callback_metrics().find("loss");
    CHECK_FALSE(loss.requires_grad());  // no autograd history kept alive by a logged value
    CHECK(loss.dim() == 0);
  }
};
}  // namespace

TEST_CASE("logging: a step value is re-pointed in place, yet what the user logged or read keeps its value",
          "[loops][logging]") {
  // Step values are held without an allocation per step (set_data); a tensor the user logged is
  // never the one re-pointed, and what find() returns is a snapshot.
  KeepsLogged model;
  std::vector<at::Tensor> read;
  CpuTrainer<FloatPrecision, ReadsBack> trainer(test::quiet({.max_epochs = 2}), ReadsBack{&read});
  trainer.fit(model, loader(64));
  REQUIRE(read.size() == model->logged.size());
  const std::size_t per_epoch = read.size() / 2;
  for (std::size_t i = 0; i < read.size(); ++i) {
    INFO("batch " << i);
    CHECK(model->logged[i].item<double>() == static_cast<double>(i % per_epoch));
    CHECK(read[i].item<double>() == static_cast<double>(i % per_epoch));  // the value of its own batch
  }
}

namespace {
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct FailsImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i) {
    if (i == 2) throw UserError("the user's own error");
    return ClassifierImpl::training_step(b, i);
  }
  void on_exception(const std::exception& e) { seen = e.what(); }
  void on_fit_end() { ended = true; }
  std::string seen;
  bool ended = false;
};
TORCH_MODULE(Fails);
}  // namespace

TEST_CASE("an exception in a step reaches on_exception, then the caller unchanged", "[loops][errors]") {
  Fails model;
  CHECK_THROWS_AS(CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1})).fit(model, loader(32)), UserError);
  CHECK(model->seen == "the user's own error");
  CHECK_FALSE(model->ended);
}

TEST_CASE("the sanity check does not change the random state training sees", "[loops][validation]") {
  struct NoisyImpl : test::ClassifierImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t i) {
      return ClassifierImpl::training_step(b, i) + 1e-3 * torch::rand({}) ;
    }
    at::Tensor validation_step(const data::Batch& b, std::int64_t i) {
      (void)torch::rand({100});  // draws from the global generator
      return ClassifierImpl::validation_step(b, i);
    }
  };
  auto run = [](std::int64_t sanity_steps) {
    torch::manual_seed(3);
    auto model = std::make_shared<NoisyImpl>();
    CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1, .num_sanity_val_steps = sanity_steps}))
        .fit(model, loader(32), loader(16));
    return test::snapshot(*model);
  };
  const auto with_check = run(2), without = run(0);
  for (std::size_t i = 0; i < with_check.size(); ++i) CHECK(torch::equal(with_check[i], without[i]));
}

TEST_CASE("a module in eval mode at the start of training is reported", "[loops][warnings]") {
  test::Classifier model;
  model->eval();
  const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1})).fit(model, loader(16));
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::StartsWith("fulgur: the module is in eval mode at the start of training"));
}

// ---- devices: tensors and modules created on the root device ---------------------------------------

TEST_CASE("DefaultDeviceGuard: factories without a device go to the guard's device, nothing else changes",
          "[loops][device]") {
  const auto cpu = torch::ones({2});
  {
    DefaultDeviceGuard on_meta{c10::Device(c10::kMeta)};  // a device with no memory: any device works the same way
    CHECK(torch::zeros({3}).is_meta());
    CHECK(torch::randn({2, 2}).is_meta());
    CHECK(torch::nn::Linear(4, 5)->weight.is_meta());        // a module's parameters, created in place
    CHECK(torch::ones({2}, at::kCPU).device().is_cpu());    // an explicit device is kept
    CHECK(cpu.to(at::kDouble).device().is_cpu());           // operators on tensors are left alone
    CHECK(torch::empty_like(cpu).device().is_cpu());
    {
      DefaultDeviceGuard nested(std::nullopt);  // nothing to do: still the meta device
      CHECK(torch::zeros({1}).is_meta());
    }
    CHECK(DefaultDeviceGuard::current() == c10::Device(c10::kMeta));
  }
  CHECK_FALSE(DefaultDeviceGuard::current().has_value());
  CHECK(torch::zeros({3}).device().is_cpu());
  // The Trainer's contexts: on CPU they create CPU tensors in the precision's dtype.
  CpuTrainer<DoublePrecision> trainer(test::quiet());
  auto init = trainer.init_tensor();
  CHECK(torch::zeros({1}).scalar_type() == at::kDouble);
}

TEST_CASE("on_exception after a failed validate: the loop's metrics are gone and log says so", "[loops][errors]") {
  // Regression (ASan, stack-use-after-scope): the evaluation loop left the context pointing at its
  // own metrics when an exception ended it; on_exception then wrote into the dead loop.
  struct FailingImpl : test::ClassifierImpl {
    at::Tensor validation_step(const data::Batch&, std::int64_t, StepContext& ctx) {
      context = &ctx;
      throw std::runtime_error("validation_step fails");
    }
    void on_exception(const std::exception&) {
      try {
        context->log("after_the_loop", 1.0);
      } catch (const MisconfigurationError& e) {
        refusal = e.what();
      }
    }
    StepContext* context = nullptr;
    std::string refusal;
  };
  auto model = std::make_shared<FailingImpl>();
  data::TensorLoader loader(torch::randn({16, 4}), torch::zeros({16}, at::kLong), {.batch_size = 8});
  CpuTrainer<FloatPrecision> trainer(test::quiet());
  CHECK_THROWS(trainer.validate(model, loader));
  CHECK(model->refusal == "You can't `log(\"after_the_loop\")` here: no loop is running.");
}

TEST_CASE("bad input in validate, test and predict names the step, the batch and the tensors", "[loops][errors]") {
  struct PredictorImpl : test::ClassifierImpl {
    at::Tensor predict_step(const data::Batch& b, std::int64_t) { return forward(b.input); }
  };
  auto model = std::make_shared<PredictorImpl>();
  data::TensorLoader narrow(torch::randn({16, 7}), torch::zeros({16}, at::kLong), {.batch_size = 8});
  CpuTrainer<FloatPrecision> trainer(test::quiet());
  const auto validated = test::message_of<StepError>([&] { trainer.validate(model, narrow); });
  CHECK_THAT(validated, Catch::StartsWith("fulgur: validation_step at epoch 0, batch 0 (global_step 0) failed under "
                                          "precision '32-true'"));
  CHECK_THAT(validated, Catch::Contains("input float32[8, 7] on cpu"));
  CHECK_THAT(test::message_of<StepError>([&] { trainer.test(model, narrow); }), Catch::StartsWith("fulgur: test_step at"));
  CHECK_THAT(test::message_of<StepError>([&] { trainer.predict(model, narrow); }),
             Catch::StartsWith("fulgur: predict_step at"));
  std::vector<data::Batch> none;
  CHECK_THAT(test::message_of<DataError>([&] { trainer.validate(model, none); }),
             Catch::StartsWith("fulgur: the validation data yielded no batches"));
}

// ---- found by a new-user probe of this loops -----------------------------------------------

TEST_CASE("probe: a stop requested in an epoch hook is reported as the reason", "[loops][regression]") {
  struct StopAtEpochEndImpl : test::ClassifierImpl {
    void on_train_epoch_end(StepContext& ctx) { ctx.should_stop = true; }
  };
  const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5}))
                     .fit(std::make_shared<StopAtEpochEndImpl>(), loader(32));
  CHECK(r.epochs.size() == 1);
  CHECK(r.stop_reason == "should_stop was set");  // was empty
}

TEST_CASE("probe: train_loss is a callback metric a scheduler can monitor", "[loops][regression]") {
  Plateau model;
  model->monitor = "train_loss";  // no validation data: used to be "not available"
  CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 3})).fit(model, loader(32));
  CHECK(model->final_lr == 0.25);  // the loss is constant (lr 0): two reductions after the first epoch
}

TEST_CASE("probe: validate's metrics are the run's epoch values, without _step values", "[loops][regression]") {
  struct StepLoggingImpl : test::ClassifierImpl {
    at::Tensor validation_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
      const auto loss = ClassifierImpl::validation_step(b, i);
      ctx.log("both", loss, {.on_step = true});
      return loss;
    }
  };
  const auto r = CpuTrainer<FloatPrecision>(test::quiet()).validate(std::make_shared<StepLoggingImpl>(), loader(32));
  CHECK(r.metrics.count("both_epoch") == 1);
  CHECK(r.metrics.count("both_step") == 0);
  CHECK(r.metrics.count("val_loss") == 1);
}

TEST_CASE("probe: a NaN validation loss in the sanity check is kept too, empty validation data is named",
          "[loops][regression]") {
  struct NaNValidationImpl : test::ClassifierImpl {
    at::Tensor validation_step(const data::Batch&, std::int64_t) { return torch::full({}, std::nan("")); }
  };
  const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 2}))
                     .fit(std::make_shared<NaNValidationImpl>(), loader(32), loader(16));
  REQUIRE(r.warnings.size() == 3);
  CHECK_THAT(r.warnings[0], Catch::Contains("NaN at epoch 0 (global_step 0)"));  // the sanity check's
  test::Classifier model;
  CHECK_THAT(test::message_of<DataError>([&] {
               CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1})).fit(model, loader(32), std::vector<data::Batch>{});
             }),
             Catch::StartsWith("fulgur: the validation data yielded no batches; give it samples, set "
                               "limit_val_batches = 0, or call fit without it."));
}

// ---- found by a review of this loops ---------------------------------------------------------

TEST_CASE("review: every evaluation hook runs without gradients (inference mode outside fit)", "[loops][regression]") {
  struct GradProbeImpl : test::ClassifierImpl {
    void on_validation_epoch_start() { grad_at_start.push_back(torch::GradMode::is_enabled()); }
    void on_validation_epoch_end() {
      grad_at_end.push_back(torch::GradMode::is_enabled());
      inference_at_end.push_back(c10::InferenceMode::is_enabled());
    }
    std::vector<bool> grad_at_start, grad_at_end, inference_at_end;
  };
  auto model = std::make_shared<GradProbeImpl>();
  CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0}));
  trainer.fit(model, loader(16), loader(16));
  trainer.validate(model, loader(16));
  CHECK(model->grad_at_start == std::vector<bool>{false, false});
  CHECK(model->grad_at_end == std::vector<bool>{false, false});
  CHECK(model->inference_at_end == std::vector<bool>{false, true});  // fit: no_grad; validate: inference mode
  CHECK(torch::GradMode::is_enabled());
}

TEST_CASE("review: an epoch plateau scheduler steps when the run stops at the epoch's last batch", "[loops][regression]") {
  Plateau model;
  model->monitor = "train_loss";
  CpuTrainer<FloatPrecision>(test::quiet({.max_steps = 8})).fit(model, loader(32));  // 2 epochs of 4 batches
  CHECK(model->final_lr == 0.5);  // epoch 1 did not improve: was left at 1.0
}

TEST_CASE("review: scheduler handles refuse the wrong call instead of crashing", "[loops][regression]") {
  AnyLRScheduler none;
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { none.step(); }),
             Catch::Contains("no scheduler was given for this optimizer"));
  torch::nn::Linear layer(2, 2);
  torch::optim::SGD sgd(layer->parameters(), 0.1);
  AnyLRScheduler plateau(std::make_unique<torch::optim::ReduceLROnPlateauScheduler>(sgd));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { plateau.step(); }),
             Catch::Contains("steps on a value: call step(monitored)"));
  AnyLRScheduler stepwise(std::make_unique<torch::optim::StepLR>(sgd, 1));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { stepwise.step(1.0); }),
             Catch::Contains("only ReduceLROnPlateau steps on a value"));
  StepContext ctx;
  CHECK_THROWS_AS(ctx.lr_schedulers(), MisconfigurationError);  // was an empty span indexed out of bounds
}

TEST_CASE("review: a new run's set-up makes the loss scaler forget an interrupted step", "[loops][regression]") {
  FP16MixedPrecision precision;
  torch::nn::Linear layer(4, 2);
  torch::optim::SGD sgd(layer->parameters(), 0.1);
  precision.backward(layer(torch::randn({3, 4})).sum(), *layer);
  precision.unscale_gradients(sgd);  // a run that ends here (a hook threw) leaves the stage `unscaled`
  REQUIRE(precision.scaler().stage(sgd) == GradScaler::Stage::unscaled);
  precision.convert_module(*layer);  // the next run's set-up
  CHECK(precision.scaler().stage(sgd) == GradScaler::Stage::ready);
  CHECK(precision.scaler().get_scale() == 65536.0);  // the scale itself is kept
}

TEST_CASE("min_steps holds a stop request back, save and load resolve relative paths under default_root_dir",
          "[loops][stop]") {
  {
    Probe model;
    model->stop_at = std::pair<std::int64_t, std::int64_t>{0, 1};
    const auto r = CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 5, .min_steps = 5})).fit(model, loader(64));
    CHECK(r.global_step == 5);
    CHECK(r.stop_reason == "should_stop was set");
  }
  char folder_template[] = "/tmp/fulgur_root_XXXXXX";
  const std::string root = ::mkdtemp(folder_template);
  CpuTrainer<FloatPrecision> trainer(test::quiet({.default_root_dir = root}));
  StateDict state;
  state.insert("epoch", static_cast<std::int64_t>(4));
  trainer.save("run/last.ckpt", state);
  CHECK(::access((root + "/run/last.ckpt").c_str(), F_OK) == 0);
  CHECK(trainer.load("run/last.ckpt").at("epoch").toInt() == 4);
  CHECK(trainer.load(root + "/run/last.ckpt").at("epoch").toInt() == 4);  // an absolute path is taken as it is
  ::unlink((root + "/run/last.ckpt").c_str());
  ::rmdir((root + "/run").c_str());
  ::rmdir(root.c_str());
}

namespace {
/// An optimizer over no parameters (the new-user probe: fit trained nothing and returned success).
struct NoParametersImpl : test::ClassifierImpl {
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{}, 1e-3);
  }
};
TORCH_MODULE(NoParameters);
}  // namespace

TEST_CASE("probe: an optimizer over no parameters is refused, naming it, in fit and in setup", "[loops][regression]") {
  NoParameters model;
  const std::string in_fit = test::message_of<MisconfigurationError>(
      [&] { CpuTrainer<FloatPrecision>(test::quiet({.max_epochs = 1})).fit(model, loader(16)); });
  CHECK_THAT(in_fit, Catch::Contains("configure_optimizers() returned a torch::optim::Adam over no parameters") &&
                         Catch::Contains("optimizer got an empty parameter list"));
  torch::optim::SGD empty(std::vector<at::Tensor>{}, 0.1);
  CpuTrainer<FloatPrecision> fabric(test::quiet());
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { fabric.setup(model, empty); }),
             Catch::Contains("Trainer::setup was given a torch::optim::SGD over no parameters"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { fabric.setup_optimizers(empty); }),
             Catch::Contains("Trainer::setup_optimizers was given a torch::optim::SGD over no parameters"));
}

namespace {
/// validation_step returns a loss per loader (val_loss/dataloader_idx_N) and counts its calls.
struct TwoLoadersImpl : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
  std::map<std::int64_t, std::int64_t> steps;  // dataloader_idx -> validation_step calls
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t, std::int64_t dataloader_idx) {
    ++steps[dataloader_idx];
    return b.input.mean() + static_cast<double>(dataloader_idx);  // depends on the data only
  }
  at::Tensor predict_step(const data::Batch& b, std::int64_t, std::int64_t dataloader_idx) {
    return b.input.sum(1) + static_cast<double>(100 * dataloader_idx);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};
TORCH_MODULE(TwoLoaders);

/// A callback written with dataloader_idx, and one written without (as with one loader): both run.
struct WithIdx {
  std::vector<std::int64_t> seen;
  template <class M, class O>
  void on_validation_batch_end(TrainerView&, M&, const O&, const data::Batch&, std::int64_t, std::int64_t dataloader_idx) {
    seen.push_back(dataloader_idx);
  }
};
struct WithoutIdx {
  std::int64_t calls = 0;
  template <class M, class O>
  void on_validation_batch_end(TrainerView&, M&, const O&, const data::Batch&, std::int64_t) {
    ++calls;
  }
};

data::TensorLoader rows(std::int64_t n, std::int64_t batch_size, float offset) {
  return data::TensorLoader(torch::arange(n * 4, torch::kFloat).reshape({n, 4}) + offset, torch::zeros({n}, torch::kLong),
                            {.batch_size = batch_size});
}
}  // namespace

TEST_CASE("several evaluation loaders: the sanity check and limits per loader, a loss per loader, callbacks with "
          "and without dataloader_idx",
          "[loops][loaders]") {
  TwoLoaders module;
  auto a = rows(12, 4, 0.0F);  // 3 batches
  auto b = rows(4, 2, 1.0F);   // 2 batches
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, WithIdx, WithoutIdx> trainer(
      test::quiet({.max_epochs = 1, .num_sanity_val_steps = 1, .limit_val_batches = 2}));
  const FitResult fit = trainer.fit(module, rows(8, 4, 0.0F), data::loaders(a, b));
  // the sanity check: 1 batch of each loader; validation: 2 of each (limit_val_batches per loader)
  CHECK(module->steps[0] == 3);
  CHECK(module->steps[1] == 3);
  // the sanity check's batch hooks run too (as Lightning's), then validation's
  CHECK(trainer.callback<WithIdx>().seen == std::vector<std::int64_t>{0, 1, 0, 0, 1, 1});
  CHECK(trainer.callback<WithoutIdx>().calls == 6);
  const double loss_a = (torch::arange(32, torch::kFloat).mean()).item<double>();  // a's first 2 batches
  const double loss_b = (torch::arange(16, torch::kFloat).mean() + 1.0).item<double>() + 1.0;
  REQUIRE(fit.metrics.contains("val_loss/dataloader_idx_0"));
  CHECK(fit.metrics.at("val_loss/dataloader_idx_0") == Approx(loss_a));
  CHECK(fit.metrics.at("val_loss/dataloader_idx_1") == Approx(loss_b));
  CHECK_FALSE(fit.metrics.contains("val_loss"));  // as Lightning names it: per loader only

  module->steps.clear();
  const std::vector<EvaluationResult> results = trainer.validate(module, {a, b});  // limit 2 again
  REQUIRE(results.size() == 2);
  CHECK(results[0].loss == Approx(loss_a));
  CHECK(results[1].loss == Approx(loss_b));
  CHECK(results[0].metrics.contains("val_loss/dataloader_idx_0"));
  CHECK_FALSE(results[0].metrics.contains("val_loss/dataloader_idx_1"));
  CHECK(module->steps[0] == 2);

  auto predictions = trainer.predict(module, data::loaders(rows(3, 2, 0.0F), rows(2, 2, 0.0F)));
  REQUIRE(predictions.size() == 2);
  REQUIRE(predictions[0].size() == 2);  // 2 batches of the first loader, in order
  REQUIRE(predictions[1].size() == 1);
  CHECK(test::identical(predictions[0][1], torch::tensor({38.0F})));             // row 2: 8 + 9 + 10 + 11
  CHECK(test::identical(predictions[1][0], torch::tensor({106.0F, 122.0F})));   // + 100 for loader 1
}

TEST_CASE("several evaluation loaders: a logged name that already says its loader is Lightning's error, "
          "add_dataloader_idx = false names it yourself",
          "[loops][loaders]") {
  struct NamedImpl : torch::nn::Module {
    torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
    bool own_name = false;
    void validation_step(const data::Batch& b, std::int64_t, std::int64_t dataloader_idx, StepContext& ctx) {
      if (own_name)
        ctx.log("acc_of_" + std::to_string(dataloader_idx), b.input.mean(), {.add_dataloader_idx = false});
      else
        ctx.log("acc/dataloader_idx_0", b.input.mean());
    }
  };
  auto module = std::make_shared<NamedImpl>();
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision> trainer(test::quiet());
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.validate(module, {rows(4, 2, 0), rows(2, 2, 0)}); }),
             Catch::Contains("should not contain information about `dataloader_idx`"));
  module->own_name = true;
  const auto results = trainer.validate(module, {rows(4, 2, 0), rows(2, 2, 0)});
  CHECK(results[0].metrics.contains("acc_of_0"));
  CHECK(results[1].metrics.contains("acc_of_1"));
  CHECK(results[0].metrics.contains("acc_of_1"));  // no suffix: a value of no one loader reaches every result
}

TEST_CASE("several evaluation loaders: a step LibTorch refuses names the loader of its batch", "[loops][loaders][errors]") {
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision> trainer(test::quiet());
  struct FitsImpl : torch::nn::Module {  // fc takes 4 columns: the second loader's batches have 3
    torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
    at::Tensor validation_step(const data::Batch& b, std::int64_t, std::int64_t) { return fc(b.input).sum(); }
  };
  auto fits = std::make_shared<FitsImpl>();
  data::TensorLoader three_columns(torch::zeros({4, 3}), torch::zeros({4}, torch::kLong), {.batch_size = 2});
  const std::string message =
      test::message_of<StepError>([&] { trainer.validate(fits, {rows(4, 2, 0.0F), three_columns}); });
  CHECK_THAT(message, Catch::Contains("validation_step at epoch 0, batch 0 (global_step 0) of the loader at "
                                      "dataloader_idx 1 failed"));
  struct OneImpl : torch::nn::Module {
    torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
    at::Tensor validation_step(const data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  };
  CHECK_THAT(test::message_of<StepError>([&] { trainer.validate(std::make_shared<OneImpl>(), three_columns); }),
             !Catch::Contains("dataloader_idx"));  // one loader: nothing to tell apart
}

namespace {
/// Logs a value on step and epoch in each loader (probe: the "_step"/"_epoch" forms under several loaders).
struct StepAndEpochImpl : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  void validation_step(const data::Batch& b, std::int64_t, std::int64_t, StepContext& ctx) {
    ctx.log("s", b.input.mean(), {.on_step = true, .on_epoch = true});
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};
/// What the loggers received: (step, names) per call.
struct StepsSeen {
  std::vector<std::pair<std::int64_t, std::vector<std::string>>> calls;
  void log_metrics(const Metrics& metrics, std::int64_t step) {
    std::vector<std::string> names;
    for (const auto& [name, value] : metrics) names.push_back(name);
    calls.emplace_back(step, names);
  }
};
}  // namespace

TEST_CASE("several evaluation loaders: step and epoch forms are named as Lightning's, each loader counts its own "
          "logging steps, a limit that leaves a loader no batch is refused before training (probe regressions)",
          "[loops][loaders]") {
  auto module = std::make_shared<StepAndEpochImpl>();
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StepsSeen> trainer(test::quiet());
  const auto results = trainer.validate(module, {rows(12, 4, 0.0F), rows(8, 4, 1.0F)});  // 3 and 2 batches
  REQUIRE(results.size() == 2);
  // Lightning's _forked_name: the suffix after "_step" / "_epoch"
  CHECK(results[0].metrics.contains("s_epoch/dataloader_idx_0"));
  CHECK(results[1].metrics.contains("s_epoch/dataloader_idx_1"));
  CHECK_FALSE(results[0].metrics.contains("s/dataloader_idx_0_epoch"));
  std::vector<std::int64_t> steps_of_0, steps_of_1;
  bool epoch_logged = false;
  for (const auto& [step, names] : trainer.callback<StepsSeen>().calls) {
    for (const auto& name : names) {
      if (name == "s_step/dataloader_idx_0") steps_of_0.push_back(step);
      if (name == "s_step/dataloader_idx_1") steps_of_1.push_back(step);
      if (name == "s_epoch/dataloader_idx_1") epoch_logged = true;
    }
  }
  CHECK(steps_of_0 == std::vector<std::int64_t>{0, 1, 2});
  CHECK(steps_of_1 == std::vector<std::int64_t>{0, 1});  // its own count (Lightning's per-loader counter)
  CHECK(epoch_logged);                                   // the epoch value reaches the loggers too

  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision> short_limit(
      test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0, .limit_val_batches = 0.25}));
  struct CountedImpl : StepAndEpochImpl {
    std::int64_t trained = 0;
    at::Tensor training_step(const data::Batch& b, std::int64_t i) {
      ++trained;
      return StepAndEpochImpl::training_step(b, i);
    }
  };
  auto counted = std::make_shared<CountedImpl>();
  const auto message = test::message_of<MisconfigurationError>(  // 0.25 x 3 batches < 1 for loader 0
      [&] { short_limit.fit(counted, rows(16, 4, 0.0F), data::loaders(rows(12, 4, 0.0F), rows(32, 4, 0.0F))); });
  CHECK_THAT(message, Catch::Contains("validation loader 0"));
  CHECK(counted->trained == 0);  // refused before training, not after an epoch
}
