// Precision policies: names, dtype flow, conversions, contexts, autocast against Python.
#include <ATen/autocast_mode.h>
#include <catch2/catch.hpp>

#include "unit/support.hpp"

using namespace fulgur;

TEST_CASE("the six precisions carry Lightning's names and satisfy fulgur::precision", "[precision]") {
  STATIC_REQUIRE(FloatPrecision::name == "32-true");
  STATIC_REQUIRE(DoublePrecision::name == "64-true");
  STATIC_REQUIRE(FP16MixedPrecision::name == "16-mixed");
  STATIC_REQUIRE(BF16MixedPrecision::name == "bf16-mixed");
  STATIC_REQUIRE(FP16TruePrecision::name == "16-true");
  STATIC_REQUIRE(BF16TruePrecision::name == "bf16-true");
  STATIC_REQUIRE(std::is_same_v<FP16MixedPrecision, MixedPrecision<torch::kHalf>>);
  STATIC_REQUIRE(std::is_same_v<BF16MixedPrecision, MixedPrecision<torch::kBFloat16>>);
  STATIC_REQUIRE(std::is_same_v<FP16TruePrecision, HalfPrecision<torch::kHalf>>);
  STATIC_REQUIRE(std::is_same_v<BF16TruePrecision, HalfPrecision<torch::kBFloat16>>);
  STATIC_REQUIRE(precision<FloatPrecision>);
  STATIC_REQUIRE(precision<DoublePrecision>);
  STATIC_REQUIRE(precision<FP16MixedPrecision>);
  STATIC_REQUIRE(precision<BF16MixedPrecision>);
  STATIC_REQUIRE(precision<FP16TruePrecision>);
  STATIC_REQUIRE(precision<BF16TruePrecision>);
  STATIC_REQUIRE(FP16MixedPrecision::uses_scaler);
  STATIC_REQUIRE_FALSE(BF16MixedPrecision::uses_scaler);
}

namespace {
// The conversion table: input dtype -> dtype after convert_input / convert_output.
std::vector<at::ScalarType> all_dtypes() {
  return {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kBool, at::kComplexFloat};
}
template <class P>
void check_conversions(P precision, at::ScalarType floating_to) {
  for (auto dtype : all_dtypes()) {
    const auto t = at::zeros({2}, dtype);
    const bool floating = at::isFloatingType(dtype);
    INFO(P::name << " input " << dtype);
    CHECK(at::Tensor(precision.convert_input(t)).scalar_type() == (floating ? floating_to : dtype));
    // Outputs come back in the default dtype (float32); non-floating outputs pass through.
    CHECK(at::Tensor(precision.convert_output(t)).scalar_type() == (floating ? at::kFloat : dtype));
  }
}
}  // namespace

TEST_CASE("conversion table: only floating tensors are converted, in and out", "[precision][dtype]") {
  for (auto dtype : all_dtypes()) {  // 32-true converts nothing
    const auto t = at::zeros({2}, dtype);
    CHECK(FloatPrecision{}.convert_input(t).scalar_type() == dtype);
    CHECK(FloatPrecision{}.convert_output(t).scalar_type() == dtype);
  }
  check_conversions(DoublePrecision{}, at::kDouble);
  check_conversions(FP16TruePrecision{}, at::kHalf);
  check_conversions(BF16TruePrecision{}, at::kBFloat16);
  check_conversions(FP16MixedPrecision{}, at::kHalf);
  check_conversions(BF16MixedPrecision{}, at::kBFloat16);
}

TEST_CASE("conversion walks nested batches", "[precision][dtype]") {
  std::map<std::string, std::tuple<at::Tensor, std::vector<at::Tensor>>> nested{
      {"a", {at::zeros({1}), {at::zeros({1}, at::kLong), at::zeros({1}, at::kDouble)}}}};
  auto converted = BF16TruePrecision{}.convert_input(nested);
  auto& [first, list] = converted.at("a");
  CHECK(first.scalar_type() == at::kBFloat16);
  CHECK(list[0].scalar_type() == at::kLong);
  CHECK(list[1].scalar_type() == at::kBFloat16);
}

TEST_CASE("true precisions convert floating parameters and buffers, never integer buffers", "[precision][dtype]") {
  torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
  DoublePrecision{}.convert_module(*net);
  for (auto& p : net->parameters()) CHECK(p.scalar_type() == at::kDouble);
  for (auto& b : net->named_buffers())
    CHECK(b.value().scalar_type() == (b.key().find("num_batches_tracked") != std::string::npos ? at::kLong : at::kDouble));
  BF16TruePrecision{}.convert_module(*net);
  for (auto& p : net->parameters()) CHECK(p.scalar_type() == at::kBFloat16);
  // Mixed precision keeps float32 master weights.
  torch::nn::Linear lin(2, 2);
  BF16MixedPrecision{}.convert_module(*lin);
  CHECK(lin->weight.scalar_type() == at::kFloat);
}

TEST_CASE("the default-dtype context restores the previous dtype, also when the body throws", "[precision][dtype]") {
  REQUIRE(c10::get_default_dtype_as_scalartype() == at::kFloat);
  {
    auto outer = DoublePrecision{}.forward_context();
    CHECK(torch::zeros({1}).scalar_type() == at::kDouble);
    {
      auto inner = FP16TruePrecision{}.module_init_context();
      CHECK(torch::zeros({1}).scalar_type() == at::kHalf);
    }
    CHECK(torch::zeros({1}).scalar_type() == at::kDouble);
  }
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);
  CHECK_THROWS_AS(
      [] {
        auto ctx = BF16TruePrecision{}.tensor_init_context();
        REQUIRE(torch::zeros({1}).scalar_type() == at::kBFloat16);
        throw std::runtime_error("inside the context");
      }(),
      std::runtime_error);
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);
}

namespace {
// Lightning's test_double_integration: a module built in init_module under 64-true.
struct DoubleModuleImpl : torch::nn::Module {
  DoubleModuleImpl() : layer(register_module("layer", torch::nn::Linear(32, 2))) {
    complex_buffer = register_buffer("complex_buffer", torch::complex(torch::rand({10}), torch::rand({10})));
  }
  at::Tensor forward(const at::Tensor& x) {
    CHECK(x.scalar_type() == at::kDouble);
    CHECK(torch::zeros({1}).scalar_type() == at::kDouble);  // default dtype inside forward
    return layer(x);
  }
  torch::nn::Linear layer;
  at::Tensor complex_buffer;
};
TORCH_MODULE(DoubleModule);
}  // namespace

TEST_CASE("64-true integration: parameters, buffers, inputs, outputs and gradients", "[precision][dtype]") {
  test::CpuTrainer<DoublePrecision> trainer(test::quiet());
  DoubleModule model = [&] {
    auto ctx = trainer.init_module();
    return DoubleModule();
  }();
  CHECK(model->layer->weight.scalar_type() == at::kDouble);
  CHECK(model->layer->bias.scalar_type() == at::kDouble);
  CHECK(model->complex_buffer.scalar_type() == at::kComplexDouble);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  trainer.setup(model, optimizer);

  const auto batch = torch::randn({4, 32});  // float32 from the loader
  at::Tensor output;
  {
    auto ctx = trainer.forward_context();
    output = model->forward(trainer.convert_input(batch));
  }
  output = trainer.convert_output(output);
  CHECK(output.scalar_type() == at::kFloat);
  trainer.backward(output.sum());
  CHECK(model->layer->weight.grad().scalar_type() == at::kDouble);
  CHECK(trainer.optimizer_step(optimizer));
  CHECK(c10::get_default_dtype_as_scalartype() == at::kFloat);
}

TEST_CASE("mixed precision: autocast on the accelerator's device, exactly as torch.autocast", "[precision][autocast]") {
  REQUIRE_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  FP16MixedPrecision fp16(at::kCPU);
  {
    auto ctx = fp16.forward_context();
    CHECK(at::autocast::is_autocast_enabled(at::kCPU));
    CHECK(at::autocast::get_autocast_dtype(at::kCPU) == at::kHalf);  // 16-mixed on CPU is fp16, never bf16
    torch::nn::Linear lin(4, 2);
    CHECK(lin(torch::randn({3, 4})).scalar_type() == at::kHalf);
    {
      auto inner = BF16MixedPrecision(at::kCPU).forward_context();
      CHECK(at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16);
      // two regions are open: the nesting count is 2
      CHECK(at::autocast::increment_nesting() == 3);
      at::autocast::decrement_nesting();
    }
    CHECK(at::autocast::get_autocast_dtype(at::kCPU) == at::kHalf);  // restored by the inner exit
    CHECK(at::autocast::is_autocast_enabled(at::kCPU));
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  CHECK(at::autocast::increment_nesting() == 1);  // every region closed
  at::autocast::decrement_nesting();
  {
    AutocastGuard off(at::kCPU, at::kBFloat16, /*enabled=*/false, /*cache_enabled=*/false);
    CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
    CHECK_FALSE(at::autocast::is_autocast_cache_enabled());
  }
  CHECK(at::autocast::is_autocast_cache_enabled());
}

TEST_CASE("autocast numerics equal Python torch.autocast('cpu') bit for bit", "[precision][autocast][golden]") {
  auto g = test::read_golden("autocast.txt");
  const auto x = g["x"], w = g["w"], bias = g["bias"], target = g["target"];
  for (auto [name, dtype] : {std::pair{"bf16", at::kBFloat16}, std::pair{"fp16", at::kHalf}}) {
    INFO(name);
    AutocastGuard ctx(at::kCPU, dtype);
    const auto y = torch::nn::functional::linear(x, w, bias);
    CHECK(test::identical(y, g[std::string(name) + ".linear"]));
    CHECK(test::identical(torch::mm(x, w.t()), g[std::string(name) + ".mm"]));
    CHECK(test::identical(torch::mse_loss(y, target), g[std::string(name) + ".mse"]));
    CHECK(test::identical(torch::log_softmax(y, 1), g[std::string(name) + ".log_softmax"]));
    CHECK(test::identical(y + 1.0, g[std::string(name) + ".add"]));
  }
}

TEST_CASE("16-mixed scales the loss in backward and skips steps on inf, 32-true always steps", "[precision][scaler]") {
  torch::nn::Linear lin(3, 1);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  FP16MixedPrecision mixed(at::kCPU);
  CHECK(mixed.scaler().get_scale() == 65536.0);
  CHECK(mixed.scaler().get_growth_factor() == 2.0);
  CHECK(mixed.scaler().get_backoff_factor() == 0.5);
  CHECK(mixed.scaler().get_growth_interval() == 2000);

  const auto x = torch::ones({2, 3});
  auto loss = lin(x).sum();
  mixed.backward(loss, *lin);
  const auto scaled_grad = lin->bias.grad().clone();
  CHECK(scaled_grad.item<float>() == Approx(2.0 * 65536.0));
  mixed.unscale_gradients(opt);
  CHECK(lin->bias.grad().item<float>() == Approx(2.0));
  CHECK(mixed.optimizer_step(opt));  // already unscaled: step() does not unscale again
  opt.zero_grad();

  mixed.backward(lin(x).sum() * std::numeric_limits<float>::infinity(), *lin);
  const auto before = lin->weight.detach().clone();
  CHECK_FALSE(mixed.optimizer_step(opt));
  CHECK(torch::equal(before, lin->weight));
  CHECK(mixed.scaler().get_scale() == 32768.0);  // backed off
  CHECK(mixed.state_dict().size() == 5);
  CHECK(BF16MixedPrecision{}.state_dict().empty());

  FloatPrecision f32;
  opt.zero_grad();
  f32.backward(lin(x).sum(), *lin);
  CHECK(f32.optimizer_step(opt));
}

TEST_CASE("16-mixed refuses LBFGS, as Lightning does", "[precision][scaler]") {
  torch::nn::Linear lin(3, 1);
  torch::optim::LBFGS opt(lin->parameters(), torch::optim::LBFGSOptions(0.1));
  FP16MixedPrecision mixed;
  mixed.backward(lin(torch::ones({1, 3})).sum(), *lin);
  CHECK(test::message_of<MisconfigurationError>([&] { mixed.optimizer_step(opt); }) ==
        "AMP and the LBFGS optimizer are not compatible.");
}

namespace {
// A regression: a float32 target from the loader meets the model's output in the loss.
struct RegressionImpl : torch::nn::Module {
  RegressionImpl() : layer(register_module("layer", torch::nn::Linear(4, 1))) {}
  at::Tensor training_step(const data::Batch& batch, std::int64_t) {
    target_dtypes.push_back(batch.target.scalar_type());
    return torch::mse_loss(layer(batch.input), batch.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.01);
  }
  torch::nn::Linear layer;
  std::vector<c10::ScalarType> target_dtypes;
};
TORCH_MODULE(Regression);

template <class P>
std::vector<c10::ScalarType> regression_target_dtypes() {
  torch::manual_seed(0);
  Regression model;
  data::TensorLoader loader(torch::randn({8, 4}), torch::randn({8, 1}), {.batch_size = 4});
  test::CpuTrainer<P> trainer(test::quiet({.max_epochs = 1}));
  const FitResult result = trainer.fit(model, loader);
  CHECK(result.global_step == 2);
  return model->target_dtypes;
}
}  // namespace

// Lightning's Double/HalfPrecision.convert_input convert the whole batch: a regression with a
// float32 target trains under "-true" (before, fit passed the target on as float32 and the loss
// failed with "Found dtype Float but expected Double"). Mixed precision leaves targets alone.
TEST_CASE("'-true' precisions convert regression targets with the inputs, mixed ones do not", "[precision][dtype]") {
  using V = std::vector<c10::ScalarType>;
  CHECK(regression_target_dtypes<DoublePrecision>() == V{at::kDouble, at::kDouble});
  CHECK(regression_target_dtypes<BF16TruePrecision>() == V{at::kBFloat16, at::kBFloat16});
  CHECK(regression_target_dtypes<BF16MixedPrecision>() == V{at::kFloat, at::kFloat});
  CHECK(regression_target_dtypes<FloatPrecision>() == V{at::kFloat, at::kFloat});
}

// The new-user probe: under '16-true' Adam's default eps is 0 in float16, and a gradient of 0 makes
// its update 0 / 0; the NaN error said only "lower the learning rate".
TEST_CASE("16-true with Adam's default eps: the NaN error names the cause", "[precision][dtype]") {
  struct IdleParameterImpl : test::ClassifierImpl {  // ClassifierImpl trains with Adam
    IdleParameterImpl() { idle = register_parameter("idle", torch::ones({2})); }
    at::Tensor training_step(const data::Batch& b, std::int64_t i) {
      return test::ClassifierImpl::training_step(b, i) + 0.0 * idle.sum();  // its gradient is exactly 0
    }
    at::Tensor idle;
  };
  auto [x, y] = test::classification_data(32);
  auto model = std::make_shared<IdleParameterImpl>();
  test::CpuTrainer<FP16TruePrecision> trainer(test::quiet({.max_epochs = 1}));
  const auto message =
      test::message_of<NonFiniteLossError>([&] { trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8})); });
  CHECK_THAT(message, Catch::Contains("eps(1e-4)") && Catch::Contains("'16-true'"));
}

namespace {
/// A precision of the user's own, under a name of its own: what it computes in is its declared dtype.
struct HouseBF16Precision : BF16MixedPrecision {
  static constexpr std::string_view name = "house-bf16";
};
}  // namespace

TEST_CASE("reduced precision on a CPU without LibTorch's fast kernels is said once per Trainer", "[precision][cpu]") {
  // LibTorch's own verdict on this CPU, from the venv's torch: oneDNN's bfloat16 kernels, or its reference loops.
  const std::string verdict = test::run_command(std::string(FULGUR_TEST_PYTHON) +
                                               " -c 'import platform, torch; print(platform.machine(), "
                                               "torch.ops.mkldnn._is_mkldnn_bf16_supported())'");
  INFO("Python: " << verdict);
  const bool fast = CPUAccelerator::has_fast_reduced_precision();
  if (verdict.starts_with("x86_64")) CHECK(fast == (verdict.find("True") != std::string::npos));

  const auto said_by = [](auto trainer) {
    torch::manual_seed(0);
    test::Classifier model;
    auto [x, y] = test::classification_data(64);
    data::TensorLoader loader(x, y, {.batch_size = 32});
    std::ostringstream captured;
    std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
    trainer.fit(model, loader, loader);
    trainer.validate(model, loader);
    std::cerr.rdbuf(original);
    const std::string text = captured.str();
    std::size_t count = 0;
    for (auto at = text.find("on this CPU will be slow"); at != std::string::npos; at = text.find("on this CPU will be slow", at + 1))
      ++count;
    return std::pair{count, text};
  };
  const auto [bf16, bf16_text] = said_by(Trainer<CPUAccelerator, SingleDeviceStrategy, BF16MixedPrecision>(
      test::quiet({.max_epochs = 1})));
  INFO(bf16_text);
  CHECK(bf16 == (fast ? 0 : 1));  // fit and validate: once
  if (!fast) CHECK_THAT(bf16_text, Catch::Contains("fulgur: bf16-mixed on this CPU will be slow") &&
                                       Catch::Contains("Train in 32-true on this machine"));
  const auto [fp32, fp32_text] = said_by(Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision>(
      test::quiet({.max_epochs = 1})));
  CHECK(fp32 == 0);
  const auto [house, house_text] = said_by(Trainer<CPUAccelerator, SingleDeviceStrategy, HouseBF16Precision>(
      test::quiet({.max_epochs = 1})));
  INFO(house_text);
  CHECK(house == (fast ? 0 : 1));
  if (!fast) CHECK_THAT(house_text, Catch::Contains("fulgur: house-bf16 on this CPU will be slow"));
  const auto [fp64, fp64_text] = said_by(Trainer<CPUAccelerator, SingleDeviceStrategy, DoublePrecision>(
      test::quiet({.max_epochs = 1})));
  CHECK(fp64 == 0);
}
