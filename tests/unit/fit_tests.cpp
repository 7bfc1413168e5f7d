// fit: parity with hand-written loops, every CPU combination, the loop's rules and limits,
// schedulers, the data it accepts, and bad input (each a clear error naming where and what).
#include <ATen/autocast_mode.h>
#include <catch2/catch.hpp>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

/// The same training written by hand against LibTorch: what fit must equal bit for bit.
std::vector<at::Tensor> hand_written_loop(bool bf16_mixed, std::int64_t accumulate = 1,
                                          std::optional<double> clip_norm = {}) {
  torch::manual_seed(7);
  test::Classifier model;
  auto [x, y] = test::classification_data(256);
  torch::optim::Adam optimizer(model->parameters(), 1e-2);
  data::TensorLoader loader(x, y, {.batch_size = 32, .shuffle = true, .seed = 5});
  const std::int64_t batches = loader.size();
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto order = loader.order_for_epoch(epoch);
    for (std::int64_t i = 0; i < batches; ++i) {
      const auto ids = order.narrow(0, i * 32, 32);
      const auto input = x.index_select(0, ids), target = y.index_select(0, ids);
      at::Tensor loss;
      if (bf16_mixed) {
        at::autocast::set_autocast_enabled(at::kCPU, true);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        at::autocast::increment_nesting();
        loss = torch::nn::functional::cross_entropy(model->forward(input), target);
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        at::autocast::set_autocast_enabled(at::kCPU, false);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      } else {
        loss = torch::nn::functional::cross_entropy(model->forward(input), target);
      }
      if (accumulate > 1) loss = loss / static_cast<double>(accumulate);
      loss.backward();
      if ((i + 1) % accumulate == 0 || i + 1 == batches) {
        if (clip_norm) clip_grad_norm(model->parameters(), *clip_norm);
        optimizer.step();
        optimizer.zero_grad();
      }
    }
  }
  return test::snapshot(*model);
}

template <class P>
std::vector<at::Tensor> fit_weights(TrainerConfig config = {}) {
  torch::manual_seed(7);
  test::Classifier model;
  auto [x, y] = test::classification_data(256);
  data::TensorLoader loader(x, y, {.batch_size = 32, .shuffle = true, .seed = 5});
  config.max_epochs = 2;
  test::CpuTrainer<P> trainer(test::quiet(config));
  trainer.fit(model, loader);
  return test::snapshot(*model);
}

bool all_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("parity: fit gives bit-identical weights to the hand-written loop (32-true)", "[trainer][parity]") {
  CHECK(all_identical(fit_weights<FloatPrecision>(), hand_written_loop(false)));
}

TEST_CASE("parity: fit gives bit-identical weights to the hand-written loop (bf16-mixed)", "[trainer][parity]") {
  const auto fitted = fit_weights<BF16MixedPrecision>();
  CHECK(all_identical(fitted, hand_written_loop(true)));
  CHECK_FALSE(all_identical(fitted, hand_written_loop(false)));  // autocast really ran
}

TEST_CASE("parity: gradient accumulation and norm clipping match the hand-written loop", "[trainer][parity]") {
  // 8 batches per epoch, accumulate 3: steps after batches 3, 6 and the epoch's last (8).
  CHECK(all_identical(fit_weights<FloatPrecision>({.accumulate_grad_batches = 3}), hand_written_loop(false, 3)));
  CHECK(all_identical(fit_weights<FloatPrecision>({.gradient_clip_val = 0.05}), hand_written_loop(false, 1, 0.05)));
  CHECK_FALSE(all_identical(fit_weights<FloatPrecision>({.gradient_clip_val = 0.05}), hand_written_loop(false)));
}

// The list of compatible CPU combinations, derived from the policy lists by fulgur::compatible.
inline constexpr auto cpu_trainers = compatible_trainers(boost::hana::tuple_t<CPUAccelerator>,
                                                         boost::hana::tuple_t<SingleDeviceStrategy>, shipped_precisions);
using CpuTrainers = trainer_tuple_t<cpu_trainers>;
static_assert(std::tuple_size_v<CpuTrainers> == decltype(boost::hana::length(shipped_precisions))::value,
              "every shipped precision runs on CPU (16-mixed included)");

TEMPLATE_LIST_TEST_CASE("every compatible CPU combination trains the classifier", "[trainer][combinations]",
                        CpuTrainers) {
  using P = typename TestType::precision_type;
  STATIC_REQUIRE(compatible<CPUAccelerator, SingleDeviceStrategy, P>);
  torch::manual_seed(1);
  // SGD: fp16 parameters cannot hold Adam's eps = 1e-8 (it rounds to 0), Lightning users see the same.
  test::Classifier model(8, 16, 3, /*use_sgd=*/true, /*lr=*/0.05);
  auto [x, y] = test::classification_data(512);
  data::TensorLoader train(x, y, {.batch_size = 32, .shuffle = true});
  data::TensorLoader val(x, y, {.batch_size = 128});
  TestType trainer(test::quiet({.max_epochs = 4}));
  CHECK(trainer.combination_name() == "cpu/single_device/" + std::string(P::name));
  const auto result = trainer.fit(model, train, val);
  REQUIRE(result.epochs.size() == 4);
  CHECK(result.global_step == 4 * 16);
  CHECK(*result.epochs.back().val_loss < *result.epochs.front().val_loss);
  CHECK(*result.epochs.back().val_loss < 0.7);  // chance level is ln 3 = 1.10
  const auto param_dtype = model->fc1->weight.scalar_type();
  if constexpr (requires { P::uses_scaler; } || std::is_same_v<P, FloatPrecision>)
    CHECK(param_dtype == at::kFloat);  // mixed: float32 master weights
  else
    CHECK(param_dtype == P::dtype);
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

namespace {
/// Records what the loop hands it: dtypes inside the step, hooks, logged values.
struct SpyImpl : torch::nn::Module {
  SpyImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    input_dtypes.push_back(b.input.scalar_type());
    target_dtypes.push_back(b.target.scalar_type());
    default_dtypes.push_back(c10::get_default_dtype_as_scalartype());
    autocast.push_back(at::autocast::is_autocast_enabled(at::kCPU));
    positions.emplace_back(ctx.current_epoch, ctx.batch_idx);
    auto loss = torch::nn::functional::cross_entropy(fc(b.input), b.target);
    ctx.log("double_loss", loss * 2);
    return loss;
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    CHECK_FALSE(is_training());
    CHECK_FALSE(torch::GradMode::is_enabled());
    validation_epochs.push_back(ctx.current_epoch);
    ctx.log("val_batch_size", static_cast<double>(b.input.size(0)));  // epoch mean weighted by batch size
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    hooks.push_back("configure_optimizers");
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  void on_fit_start() { hooks.push_back("on_fit_start"); }
  void on_train_start() { hooks.push_back("on_train_start"); }
  void on_train_epoch_start() { hooks.push_back("on_train_epoch_start"); }
  void on_train_epoch_end() { hooks.push_back("on_train_epoch_end"); }
  void on_validation_epoch_end() { hooks.push_back("on_validation_epoch_end"); }
  void on_train_end() { hooks.push_back("on_train_end"); }
  torch::nn::Linear fc;
  std::vector<at::ScalarType> input_dtypes, target_dtypes, default_dtypes;
  std::vector<bool> autocast;
  std::vector<std::pair<std::int64_t, std::int64_t>> positions;
  std::vector<std::int64_t> validation_epochs;
  std::vector<std::string> hooks;
};
TORCH_MODULE(Spy);

template <class P>
Spy run_spy(TrainerConfig config = {.max_epochs = 2}, FitResult* result = nullptr) {
  Spy spy;
  auto [x, y] = test::classification_data(40);
  data::TensorLoader train(x, y, {.batch_size = 16});
  data::TensorLoader val(x, y, {.batch_size = 16});
  test::CpuTrainer<P> trainer(test::quiet(config));
  const auto r = trainer.fit(spy, train, val);
  if (result) *result = r;
  return spy;
}
}  // namespace

TEST_CASE("dtype flow in fit: inputs converted, targets kept, contexts open only around the step", "[trainer][dtype]") {
  auto f32 = run_spy<FloatPrecision>();
  CHECK(f32->input_dtypes.front() == at::kFloat);
  CHECK(f32->autocast.front() == false);
  auto f64 = run_spy<DoublePrecision>();
  CHECK(f64->input_dtypes.front() == at::kDouble);
  CHECK(f64->default_dtypes.front() == at::kDouble);
  CHECK(f64->fc->weight.scalar_type() == at::kDouble);
  auto bf16 = run_spy<BF16MixedPrecision>();
  CHECK(bf16->input_dtypes.front() == at::kBFloat16);
  CHECK(bf16->autocast.front() == true);
  CHECK(bf16->default_dtypes.front() == at::kFloat);
  auto fp16 = run_spy<FP16TruePrecision>();
  CHECK(fp16->input_dtypes.front() == at::kHalf);
  CHECK(fp16->target_dtypes.front() == at::kLong);  // integer targets untouched
  CHECK(fp16->default_dtypes.front() == at::kHalf);
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);
}

TEST_CASE("positions reach the steps, logged values reach the result", "[trainer][hooks]") {
  FitResult result;
  auto spy = run_spy<FloatPrecision>({.max_epochs = 2}, &result);
  // val batches of 16, 16 and 8: the weighted mean of the logged batch sizes is (16*16*2 + 8*8) / 40
  CHECK(result.metrics.at("val_batch_size") == Approx((16.0 * 16 * 2 + 8 * 8) / 40));
  // the sanity check ran 2 validation batches of epoch 0 first
  CHECK(spy->validation_epochs == std::vector<std::int64_t>{0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(result.metrics.count("double_loss") == 1);
  CHECK(spy->positions == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}});
}

TEST_CASE("validation loss is the batch-size-weighted mean over the data", "[trainer][validation]") {
  torch::manual_seed(2);
  test::Classifier model;
  auto [x, y] = test::classification_data(50);
  data::TensorLoader train(x, y, {.batch_size = 16});
  data::TensorLoader val(x, y, {.batch_size = 16});  // 16 + 16 + 16 + 2
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  const auto result = trainer.fit(model, train, val);
  torch::NoGradGuard no_grad;
  model->eval();
  const double expected = torch::nn::functional::cross_entropy(model->forward(x), y).item<double>();
  CHECK(*result.epochs.front().val_loss == Approx(expected).epsilon(1e-6));
  CHECK(result.metrics.at("val_loss") == *result.epochs.front().val_loss);
  CHECK(*trainer.validate(model, val).loss == Approx(expected).epsilon(1e-6));
  CHECK(trainer.validate(model, val).metrics.at("val_loss") == Approx(expected).epsilon(1e-6));
}

TEST_CASE("max_steps, limit_train_batches and check_val_every_n_epoch bound the loop", "[trainer][loop]") {
  auto [x, y] = test::classification_data(64);
  data::TensorLoader train(x, y, {.batch_size = 8});
  data::TensorLoader val(x, y, {.batch_size = 64});
  test::Classifier model;
  {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 10, .max_steps = 11}));
    const auto r = trainer.fit(model, train);
    CHECK(r.global_step == 11);
    CHECK(r.epochs.size() == 2);
  }
  {
    test::CpuTrainer<FloatPrecision> trainer(
        test::quiet({.max_epochs = 3, .check_val_every_n_epoch = 2, .limit_train_batches = 3}));
    const auto r = trainer.fit(model, train, val);
    CHECK(r.global_step == 9);
    CHECK_FALSE(r.epochs[0].val_loss.has_value());
    CHECK(r.epochs[1].val_loss.has_value());
    CHECK_FALSE(r.epochs[2].val_loss.has_value());
  }
  {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1, .accumulate_grad_batches = 3}));
    CHECK(trainer.fit(model, train).global_step == 3);  // 8 batches: steps after 3, 6, 8
  }
}

namespace {
/// Makes the loss infinite on chosen batches, so the scaler skips those steps.
struct OverflowImpl : torch::nn::Module {
  OverflowImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx) {
    auto loss = torch::nn::functional::cross_entropy(fc(b.input), b.target);
    return batch_idx == 1 || batch_idx == 2 ? loss * std::numeric_limits<float>::infinity() : loss;
  }
  OptimizerConfig configure_optimizers() {
    auto optimizer = std::make_unique<torch::optim::SGD>(parameters(), 1.0);
    auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, /*step_size=*/1, /*gamma=*/0.5);
    return {std::move(optimizer), std::move(scheduler), interval};
  }
  torch::nn::Linear fc;
  SchedulerInterval interval = SchedulerInterval::step;
};
TORCH_MODULE(Overflow);
double lr_of(torch::optim::Optimizer& o) { return o.param_groups()[0].options().get_lr(); }
}  // namespace

TEST_CASE("an LR scheduler steps only when the optimizer really stepped (16-mixed skips)", "[trainer][scheduler]") {
  Overflow model;
  auto [x, y] = test::classification_data(48);
  data::TensorLoader train(x, y, {.batch_size = 8});  // 6 batches, batches 1 and 2 overflow
  test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet({.max_epochs = 1}));
  const auto result = trainer.fit(model, train);
  CHECK(result.global_step == 6);
  CHECK(result.skipped_optimizer_steps == 2);
  CHECK(trainer.precision().scaler().get_scale() == 65536.0 / 4);  // backed off twice
}

namespace {
struct LrProbeImpl : OverflowImpl {
  OptimizerConfig configure_optimizers() {
    auto config = OverflowImpl::configure_optimizers();
    optimizer = config.optimizer.get();
    return config;
  }
  void on_train_end() { final_lr = lr_of(*optimizer); }
  torch::optim::Optimizer* optimizer = nullptr;
  double final_lr = 0;
};
TORCH_MODULE(LrProbe);
}  // namespace

TEST_CASE("scheduler: step interval skips AMP-skipped steps, epoch interval steps once per epoch", "[trainer][scheduler]") {
  auto [x, y] = test::classification_data(48);
  data::TensorLoader train(x, y, {.batch_size = 8});
  {
    LrProbe probe;
    test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet({.max_epochs = 1}));
    trainer.fit(probe, train);
    CHECK(probe->final_lr == 0.5 * 0.5 * 0.5 * 0.5);
  }
  {
    LrProbe probe;
    probe->interval = SchedulerInterval::epoch;
    test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet({.max_epochs = 3}));
    trainer.fit(probe, train);
    CHECK(probe->final_lr == 0.5 * 0.5 * 0.5);
  }
}

TEST_CASE("fit accepts TORCH_MODULE holders, shared_ptrs, vectors of batches and torch::data loaders", "[trainer][data]") {
  auto [x, y] = test::classification_data(64);
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  auto shared = std::make_shared<test::ClassifierImpl>();
  std::vector<data::Batch> batches{{x.narrow(0, 0, 32), y.narrow(0, 0, 32)}, {x.narrow(0, 32, 32), y.narrow(0, 32, 32)}};
  CHECK(trainer.fit(shared, batches).global_step == 2);

  struct ExampleNetImpl : torch::nn::Module {
    ExampleNetImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
    at::Tensor training_step(const torch::data::Example<>& b, std::int64_t) {
      return torch::nn::functional::cross_entropy(fc(b.data), b.target);
    }
    std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
      return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
    }
    torch::nn::Linear fc;
  };
  auto net = std::make_shared<ExampleNetImpl>();
  auto loader = torch::data::make_data_loader(
      torch::data::datasets::TensorDataset(x).map(torch::data::transforms::Lambda<torch::data::TensorExample, torch::data::Example<>>(
          [](torch::data::TensorExample e) { return torch::data::Example<>(e.data, e.data.select(0, 0).gt(0).to(at::kLong)); })).map(
          torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(16));
  CHECK(trainer.fit(net, loader).global_step == 4);
}

TEST_CASE("the Fabric-level verbs make a custom loop", "[trainer][fabric]") {
  torch::manual_seed(0);
  test::CpuTrainer<BF16MixedPrecision> trainer(test::quiet());
  test::Classifier model;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  trainer.setup(model, optimizer);
  auto [x, y] = test::classification_data(64);
  auto loader = trainer.setup_dataloader(data::TensorLoader(x, y, {.batch_size = 16}));
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 5; ++epoch)
    for (const auto& batch : loader) {
      const auto b = trainer.batch_to_device(batch);
      at::Tensor loss;
      {
        auto ctx = trainer.forward_context();
        loss = torch::nn::functional::cross_entropy(model->forward(b.input), b.target);
      }
      trainer.backward(loss);
      trainer.clip_gradients(model, optimizer, {.max_norm = 1.0});
      CHECK(trainer.optimizer_step(optimizer));
      optimizer.zero_grad();
      (first == 0 ? first : last) = loss.item<double>();
    }
  CHECK(last < first);
  CHECK(trainer.all_reduce(torch::ones({1}), ReduceOp::sum).item<float>() == 1.0f);
  CHECK(trainer.is_global_zero());
}

TEST_CASE("the same seed gives the same run", "[trainer][seed]") {
  auto run = [] {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1, .seed = 123}));
    test::Classifier model;  // initialised after the trainer seeded torch
    auto [x, y] = test::classification_data(64);
    data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true});
    trainer.fit(model, loader);
    return test::snapshot(*model);
  };
  CHECK(all_identical(run(), run()));
}

// ---- bad input: each is a clear error naming where and what to change --------------------------

TEST_CASE("bad input: wrong batch dtype or shape names the step, batch and tensors", "[trainer][errors]") {
  test::Classifier model;
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  {
    auto [x, y] = test::classification_data(32);
    data::TensorLoader ints(x.to(at::kLong), y, {.batch_size = 16});
    const auto message = test::message_of<StepError>([&] { trainer.fit(model, ints); });
    CHECK_THAT(message, Catch::StartsWith("fulgur: training_step at epoch 0, batch 0 (global_step 0) failed under "
                                          "precision '32-true'"));
    CHECK_THAT(message, Catch::Contains("batch: input int64[16, 8] on cpu, target int64[16] on cpu"));
    CHECK_THAT(message, Catch::Contains("the module's parameters are float32 on cpu"));
  }
  {
    data::TensorLoader narrow(torch::randn({32, 7}), torch::zeros({32}, at::kLong), {.batch_size = 16});
    const auto message = test::message_of<StepError>([&] { trainer.fit(model, narrow); });
    CHECK_THAT(message, Catch::Contains("input float32[16, 7] on cpu"));
    CHECK_THAT(message, Catch::Contains("mat1 and mat2 shapes cannot be multiplied"));
  }
}

TEST_CASE("bad input: a batch that cannot reach the device names it", "[trainer][errors]") {
  test::Classifier model;
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  // meta tensors have no data: they cannot be copied to any device, like a batch on a lost GPU
  std::vector<data::Batch> batches{{torch::empty({4, 8}, at::Device(at::kMeta)), torch::zeros({4}, at::kLong)}};
  const auto message = test::message_of<StepError>([&] { trainer.fit(model, batches); });
  CHECK_THAT(message, Catch::StartsWith("fulgur: moving the batch of training_step at epoch 0, batch 0 (global_step 0) "
                                        "to cpu failed"));
  CHECK_THAT(message, Catch::Contains("input float32[4, 8] on meta"));
}

TEST_CASE("bad input: an empty loader, no parameters, no optimizer, a non-scalar loss", "[trainer][errors]") {
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  test::Classifier model;
  data::TensorLoader empty(torch::randn({3, 8}), torch::zeros({3}, at::kLong), {.batch_size = 4, .drop_last = true});
  const auto message = test::message_of<DataError>([&] { trainer.fit(model, empty); });
  CHECK_THAT(message, Catch::StartsWith("fulgur: the training data yielded no batches (TensorLoader with 3 "
                                        "samples, batch_size 4, drop_last)"));
  std::vector<data::Batch> none;
  CHECK_THROWS_AS(trainer.fit(model, none), DataError);

  struct EmptyImpl : torch::nn::Module {
    at::Tensor training_step(const data::Batch& b, std::int64_t) { return b.input.sum(); }
    std::unique_ptr<torch::optim::Optimizer> configure_optimizers() { return nullptr; }
  };
  auto empty_module = std::make_shared<EmptyImpl>();
  auto [x, y] = test::classification_data(8);
  data::TensorLoader loader(x, y, {.batch_size = 4});
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(empty_module, loader); }),
             Catch::Contains("has no parameters, so there is nothing to train"));

  struct NoOptimizerImpl : torch::nn::Module {
    NoOptimizerImpl() { register_parameter("w", torch::ones({8})); }
    at::Tensor training_step(const data::Batch& b, std::int64_t) { return b.input.sum(); }
    std::unique_ptr<torch::optim::Optimizer> configure_optimizers() { return nullptr; }
  };
  auto no_optimizer = std::make_shared<NoOptimizerImpl>();
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.fit(no_optimizer, loader); }),
             Catch::StartsWith("fulgur: configure_optimizers() returned no optimizer"));

  struct VectorLossImpl : test::ClassifierImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t) {
      return torch::nn::functional::cross_entropy(forward(b.input), b.target,
                                                  torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    }
  };
  auto vector_loss = std::make_shared<VectorLossImpl>();
  CHECK_THAT(test::message_of<StepError>([&] { trainer.fit(vector_loss, loader); }),
             Catch::Contains("returned float32[4] on cpu; return the scalar loss"));
  CHECK_THROWS_AS(test::CpuTrainer<FloatPrecision>(test::quiet({.accumulate_grad_batches = 0})), MisconfigurationError);
}

TEST_CASE("bad input: BatchNorm over a last batch of one sample advises drop_last, not dtype/shape/device",
          "[trainer][errors]") {
  // Found by the new-user probe: 33 samples in batches of 8 leave one; the old advice was about dtypes.
  struct NormedImpl : test::ClassifierImpl {
    NormedImpl() : norm(register_module("norm", torch::nn::BatchNorm1d(8))) {}
    at::Tensor training_step(const data::Batch& b, std::int64_t) {
      return torch::nn::functional::cross_entropy(forward(norm(b.input)), b.target);
    }
    torch::nn::BatchNorm1d norm;
  };
  auto [x, y] = test::classification_data(33);
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  auto model = std::make_shared<NormedImpl>();
  const auto message =
      test::message_of<StepError>([&] { trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8})); });
  CHECK_THAT(message, Catch::StartsWith("fulgur: training_step at epoch 0, batch 4 (global_step 4) failed"));
  CHECK_THAT(message, Catch::Contains("Expected more than 1 value per channel when training"));
  CHECK_THAT(message, Catch::Contains("input float32[1, 8] on cpu"));
  CHECK_THAT(message, Catch::Contains("drop_last = true on the loader (fulgur::data::TensorLoaderOptions::drop_last)"));
  CHECK_THAT(message, !Catch::Contains("dtype, shape and device"));
  // The advice works.
  CHECK(trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8, .drop_last = true})).global_step == 4);
}

TEST_CASE("bad input: a non-finite loss under 32-true stops the run and names the batch", "[trainer][errors]") {
  auto [x, y] = test::classification_data(64);
  x[37][2] = std::numeric_limits<float>::quiet_NaN();  // sample 37 is in batch 4 (batch_size 8)
  data::TensorLoader loader(x, y, {.batch_size = 8});
  {
    test::Classifier model;
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1, .finite_loss_check = FiniteLossCheck::every_step}));
    const auto message = test::message_of<NonFiniteLossError>([&] { trainer.fit(model, loader); });
    // the same position a StepError would give for that batch
    CHECK_THAT(message, Catch::StartsWith("fulgur: the loss is NaN at training_step at epoch 0, batch 4 (global_step 4) "
                                          "under precision '32-true'."));
    CHECK_THAT(message, !Catch::Contains("FiniteLossCheck::every_step"));  // it is on already
  }
  {  // default: checked when the loss is read anyway (here: the epoch's last batch)
    test::Classifier model;
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
    const auto message = test::message_of<NonFiniteLossError>([&] { trainer.fit(model, loader); });
    CHECK_THAT(message, Catch::Contains("batch 7 (global_step 7)"));
    CHECK_THAT(message, Catch::Contains("last seen finite at global_step 0"));
    CHECK_THAT(message, Catch::Contains("set TrainerConfig::finite_loss_check = FiniteLossCheck::every_step to stop at "
                                        "the first bad batch"));
  }
  {  // under 16-mixed the scaler absorbs it: the steps are skipped, the run goes on
    test::Classifier model;
    test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet({.max_epochs = 1}));
    CHECK(trainer.fit(model, loader).skipped_optimizer_steps >= 1);
  }
}

TEST_CASE("dispatch: run-time strings pick the compiled Trainer type, a wrong choice lists the valid ones",
          "[dispatch]") {
  auto name_of = [](auto trainer_type) { return decltype(trainer_type)::type::combination_name(); };
  CHECK(dispatch("cpu", "single_device", "bf16-mixed", name_of) == "cpu/single_device/bf16-mixed");
  CHECK(dispatch("cpu", "single_device", "16", name_of) == "cpu/single_device/16-mixed");  // Lightning's alias
  CHECK(dispatch("gpu", "single_device", "64", name_of) == "cuda/single_device/64-true");
  int calls = 0;
  dispatch("cpu", "single_device", "32-true", [&](auto) { ++calls; });
  CHECK(calls == 1);
  // A valid name on each axis, a combination not compiled: named, with the valid ones.
  constexpr auto two = boost::hana::tuple_t<test::CpuTrainer<FloatPrecision>,
                                            Trainer<CPUAccelerator, DDPStrategy, BF16MixedPrecision>>;
  const auto message = test::message_of<MisconfigurationError>([&] { dispatch("cpu", "ddp", "32-true", name_of, two); });
  CHECK_THAT(message, Catch::StartsWith("fulgur::dispatch: no compiled combination is accelerator='cpu', "
                                        "strategy='ddp', precision='32-true': this program did not compile it"));
  CHECK_THAT(message, Catch::EndsWith("are: cpu/single_device/32-true, cpu/ddp/bf16-mixed."));
  // Every shipped triple is compatible (Auto picks Gloo or NCCL by device): nothing is filtered out.
  constexpr auto count = [](auto list) { return decltype(boost::hana::length(list))::value; };
  STATIC_REQUIRE(count(shipped_trainers) ==
                 count(shipped_accelerators) * count(shipped_strategies) * count(shipped_precisions));
  CHECK(dispatch("cpu", "ddp", "bf16-mixed", name_of) == "cpu/ddp/bf16-mixed");
  CHECK(dispatch("cpu", "DDP", "bf16-mixed", name_of) == "cpu/ddp/bf16-mixed");  // strategies in any case (Lightning)
}

TEST_CASE("dispatch: the sharded strategies, 'auto' on each axis, and errors that name the wrong axis (probe)",
          "[dispatch]") {
  // Found by the new-user probe: "fsdp" and "auto" were unknown, and a misspelt name listed all 24 combinations.
  auto name_of = [](auto trainer_type) { return decltype(trainer_type)::type::combination_name(); };
  constexpr auto sharded = compatible_trainers(boost::hana::tuple_t<CPUAccelerator>, shipped_sharded_strategies,
                                               boost::hana::tuple_t<FloatPrecision, DoublePrecision, BF16MixedPrecision>);
  CHECK(dispatch("cpu", "deepspeed_stage_1", "32-true", name_of, sharded) == "cpu/deepspeed_stage_1/32-true");
  CHECK(dispatch("cpu", "deepspeed_stage_2", "bf16", name_of, sharded) == "cpu/deepspeed_stage_2/bf16-mixed");
  CHECK(dispatch("cpu", "fsdp", "32-true", name_of, sharded) == "cpu/fsdp/32-true");
  CHECK(dispatch("cpu", "deepspeed_stage_3", "32-true", name_of, sharded) == "cpu/fsdp/32-true");  // the same stage
  // Valid names whose combination is not compiled because it is incompatible: the rule is named.
  constexpr auto nccl = compatible_trainers(shipped_accelerators,
                                            boost::hana::tuple_t<SingleDeviceStrategy, BasicDDPStrategy<backend::NCCL>>,
                                            boost::hana::tuple_t<FloatPrecision>);
  const auto rule = test::message_of<MisconfigurationError>([&] { dispatch("cpu", "ddp", "32-true", name_of, nccl); });
  CHECK_THAT(rule, Catch::StartsWith("fulgur::dispatch: no compiled combination is accelerator='cpu', strategy='ddp', "
                                     "precision='32-true': " FULGUR_MSG_STRATEGY_ACCELERATOR));
  CHECK_THAT(rule, Catch::EndsWith("are: cpu/single_device/32-true, cuda/single_device/32-true, cuda/ddp/32-true."));
  // A shipped strategy the program did not compile: which axis, what it compiled, how to add it.
  const auto not_compiled = test::message_of<MisconfigurationError>([&] { dispatch("cpu", "fsdp", "32-true", name_of); });
  CHECK(not_compiled ==
        "fulgur::dispatch: strategy 'fsdp' is not among the combinations this program compiled; the strategy names it "
        "takes are 'single_device', 'ddp' (also 'auto'). Add its policy to the "
        "Trainer types given to dispatch (the sharded strategies are fulgur::shipped_sharded_strategies).");
  // A misspelt name: that axis and its names only, not every combination.
  const auto misspelt = test::message_of<MisconfigurationError>([&] { dispatch("cpu", "fdsp", "32-true", name_of); });
  CHECK_THAT(misspelt, Catch::StartsWith("fulgur::dispatch: strategy 'fdsp' is unknown. Did you mean 'fsdp'? The strategy "
                                         "names it takes are 'single_device', 'ddp'"));
  CHECK_THAT(misspelt, !Catch::Contains("cpu/single_device/16-mixed") && !Catch::Contains("accelerator"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { dispatch("tpu", "ddp", "32-true", name_of); }),
             Catch::StartsWith("fulgur::dispatch: accelerator 'tpu' is unknown; the accelerator names it takes are "
                               "'cpu', 'cuda' (also 'gpu' for 'cuda', and 'auto')."));
  const auto precision = test::message_of<MisconfigurationError>([&] { dispatch("cpu", "ddp", "fp8", name_of); });
  CHECK_THAT(precision, Catch::StartsWith("fulgur::dispatch: precision 'fp8' is unknown; the precision names it takes "
                                          "are '32-true', '64-true', '16-mixed', 'bf16-mixed', '16-true', 'bf16-true'"));
  CHECK_THAT(precision, !Catch::Contains("strategy '") && !Catch::Contains("Did you mean"));  // nothing is close
  // The name probably meant (a probe found `fp16` answered with the list alone): names from elsewhere, and
  // misspellings of a name on that axis (compiled, shipped or an alias), in any case, '-' and '_' alike.
  auto meant = [&](const char* a, const char* s, const char* p) {
    return test::message_of<MisconfigurationError>([&] { dispatch(a, s, p, name_of); });
  };
  CHECK_THAT(meant("cpu", "single_device", "fp16"),
             Catch::StartsWith("fulgur::dispatch: precision 'fp16' is unknown. Did you mean '16-mixed'? ('16-true' "
                               "keeps the weights in float16 too.) The precision names it takes are '32-true'"));
  CHECK_THAT(meant("cpu", "single_device", "BFloat16"), Catch::Contains("Did you mean 'bf16-mixed'"));
  CHECK_THAT(meant("cpu", "single_device", "16_Mixed"), Catch::Contains("Did you mean '16-mixed'?"));
  CHECK_THAT(meant("cpu", "single_device", "bf16-mixd"), Catch::Contains("Did you mean 'bf16-mixed'?"));
  CHECK_THAT(meant("cpu", "ddp_spawn", "32-true"), Catch::Contains("strategy 'ddp_spawn' is unknown. Did you mean 'ddp'"));
  CHECK_THAT(meant("cpu", "sinlge_device", "32-true"), Catch::Contains("Did you mean 'single_device'?"));
  CHECK_THAT(meant("cpu", "deepspeed_stage_22", "32-true"), Catch::Contains("Did you mean 'deepspeed_stage_2'?"));
  CHECK_THAT(meant("cdua", "ddp", "32-true"), Catch::Contains("accelerator 'cdua' is unknown. Did you mean 'cuda'?"));
  CHECK_THAT(meant("tpu", "ddp", "32-true"), !Catch::Contains("Did you mean"));  // one letter of three: not a typo
  // Only the aliases of what the program compiled (the probe found '64' offered by a program without 64-true).
  constexpr auto two_precisions = compatible_trainers(boost::hana::tuple_t<CPUAccelerator>,
                                                      boost::hana::tuple_t<SingleDeviceStrategy>,
                                                      boost::hana::tuple_t<FloatPrecision, BF16MixedPrecision>);
  CHECK(test::message_of<MisconfigurationError>([&] { dispatch("cpu", "single_device", "64", name_of, two_precisions); }) ==
        "fulgur::dispatch: precision '64' ('64-true') is not among the combinations this program compiled; the "
        "precision names it takes are '32-true', 'bf16-mixed' (also '32' for '32-true', 'bf16' for 'bf16-mixed', and "
        "'auto' for '32-true'). Add its policy to the Trainer types given to dispatch.");
  // 'auto', as Lightning's connector: the accelerator by availability, the strategy by process count,
  // the precision '32-true'.
  const std::string best = CUDAAccelerator::is_available() ? "cuda" : "cpu";
  CHECK(dispatch("auto", "auto", "auto", name_of) == best + "/single_device/32-true");
  // A list without CUDA: 'auto' is the CPU on any machine.
  CHECK(dispatch("auto", "single_device", "bf16-mixed", name_of, cpu_trainers) == "cpu/single_device/bf16-mixed");
  CHECK(dispatch("cpu", "auto", "32-true", name_of, shipped_trainers, TrainerConfig{.devices = 2}) == "cpu/ddp/32-true");
  CHECK(dispatch("cpu", "auto", "32-true", name_of, shipped_trainers, TrainerConfig{.devices = "3"}) == "cpu/ddp/32-true");
  CHECK(dispatch("cpu", "auto", "32-true", name_of, shipped_trainers, TrainerConfig{.num_nodes = 2}) == "cpu/ddp/32-true");
  CHECK(dispatch("cpu", "auto", "32-true", name_of, shipped_trainers, TrainerConfig{.devices = -1}) ==
        "cpu/single_device/32-true");  // all the CPU's devices: one
}


TEST_CASE("Fabric-level misuse: a negative clip bound, optimizer_step before trainer.backward (probe regressions)",
          "[trainer][fabric][errors]") {
  torch::manual_seed(0);
  test::Classifier model;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  auto [x, y] = test::classification_data(16);
  {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet());
    trainer.setup(model, optimizer);
    trainer.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
    const at::Tensor before = model->parameters().front().grad().clone();
    CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.clip_gradients(model, optimizer, {.max_norm = -1.0}); }),
               Catch::Contains("`max_norm` must be >= 0, got -1"));
    CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.clip_gradients(model, optimizer, {.clip_val = -0.5}); }),
               Catch::Contains("`clip_val` must be >= 0"));
    CHECK_THROWS_AS(trainer.clip_gradients(model, optimizer, {.clip_val = std::nan("")}), MisconfigurationError);
    CHECK(torch::equal(model->parameters().front().grad(), before));  // nothing was touched
    CHECK_THROWS_WITH(trainer.clip_gradients(model, optimizer, {.clip_val = 1.0, .max_norm = 1.0}),
                      Catch::Contains("Only one of `clip_val` or `max_norm`"));
  }
  {
    test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet());
    trainer.setup(model, optimizer);
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();  // not trainer.backward
    CHECK_THAT(test::message_of<GradScalerError>([&] { trainer.optimizer_step(optimizer); }),
               Catch::Contains("call trainer.backward(loss)"));
  }
}
