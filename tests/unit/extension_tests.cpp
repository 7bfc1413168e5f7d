// Extending fulgur: the user policies of docs/extending.md (examples/extending/, included here so
// the docs cannot drift from code that compiles and trains), each trained through Trainer.
#include <catch2/catch.hpp>

#include "../../examples/extending/announcing_strategy.hpp"
#include "../../examples/extending/counting_precision.hpp"
#include "../../examples/extending/gentle_fp16_precision.hpp"
#include "../../examples/extending/skip_nonfinite_strategy.hpp"
#include "../../examples/extending/xpu_accelerator.hpp"
#include "unit/support.hpp"

using namespace fulgur;

namespace {
data::TensorLoader loader(std::int64_t samples) {
  auto [x, y] = test::classification_data(samples);
  return data::TensorLoader(x, y, {.batch_size = 16});
}

/// An accelerator for the host from the defaults base: two constants and nothing else.
struct HostAccelerator : accelerator_defaults<HostAccelerator> {
  static constexpr std::string_view name = "host";
  static constexpr c10::DeviceType device_type = c10::kCPU;
};
}  // namespace

TEST_CASE("a precision that changes one member (derived from FloatPrecision) trains through Trainer", "[extension]") {
  STATIC_REQUIRE(precision<CountingPrecision>);
  Trainer<CPUAccelerator, SingleDeviceStrategy, CountingPrecision> trainer(test::quiet({.max_epochs = 2}));
  test::Classifier model;
  const auto result = trainer.fit(model, loader(64));
  CHECK(trainer.precision().steps == 8);
  CHECK(result.global_step == 8);
  CHECK(trainer.combination_name() == "cpu/single_device/32-true");
}

TEST_CASE("a shipped precision configured by deriving: its scaler starts where the user says", "[extension]") {
  STATIC_REQUIRE(precision<GentleFP16MixedPrecision>);
  STATIC_REQUIRE(compatible<CPUAccelerator, SingleDeviceStrategy, GentleFP16MixedPrecision>);
  Trainer<CPUAccelerator, SingleDeviceStrategy, GentleFP16MixedPrecision> trainer(test::quiet({.max_epochs = 1}));
  CHECK(trainer.precision().scaler().get_scale() == 1024.0);
  CHECK(trainer.precision().device_type() == c10::kCPU);  // built from the accelerator, as the original
  test::Classifier model;
  trainer.fit(model, loader(64));
  CHECK(trainer.precision().scaler().get_growth_interval() == 500);
  CHECK(model->fc1->weight.scalar_type() == at::kFloat);  // still '16-mixed': float32 weights, fp16 autocast
}

namespace {
/// Turns the loss NaN on one batch: under 32-true its gradients are NaN too.
struct OneBadBatchImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i) {
    const auto loss = ClassifierImpl::training_step(b, i);
    return i == 1 ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
  }
};
TORCH_MODULE(OneBadBatch);
}  // namespace

TEST_CASE("a strategy that changes one member (from strategy_defaults) trains through Trainer", "[extension]") {
  STATIC_REQUIRE(strategy<SkipNonFiniteStrategy>);
  OneBadBatch model;
  Trainer<CPUAccelerator, SkipNonFiniteStrategy, FloatPrecision> trainer(
      test::quiet({.max_epochs = 1, .finite_loss_check = FiniteLossCheck::off}));
  const auto result = trainer.fit(model, loader(64));
  CHECK(result.skipped_optimizer_steps == 1);  // the NaN batch's step did not run...
  for (const auto& p : model->parameters()) CHECK(p.isfinite().all().item<bool>());  // ...so the weights stayed finite
  CHECK(trainer.combination_name() == "cpu/skip_nonfinite/32-true");
  // The same model under SingleDeviceStrategy ends with NaN weights.
  OneBadBatch plain;
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision>(
      test::quiet({.max_epochs = 1, .finite_loss_check = FiniteLossCheck::off}))
      .fit(plain, loader(64));
  CHECK_FALSE(plain->fc1->weight.isfinite().all().item<bool>());
}

namespace {
/// DDP with one member changed, named as its own Derived, so the defaults DDP inherits call it too.
struct CountingDDPStrategy : BasicDDPStrategy<backend::Gloo, CountingDDPStrategy> {
  void setup_module(torch::nn::Module& module) {
    ++setups;
    BasicDDPStrategy::setup_module(module);
  }
  int setups = 0;
};
}  // namespace

TEST_CASE("a strategy derived from DDP with its own name as Derived: the defaults call its override", "[extension]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  STATIC_REQUIRE(strategy<CountingDDPStrategy>);
  Trainer<CPUAccelerator, CountingDDPStrategy, FloatPrecision> trainer(test::quiet({.max_epochs = 1}),
                                                                      {.bucket_bytes = 4096});
  test::Classifier model;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  trainer.setup(model, optimizer);  // setup_module_and_optimizers, a default, reaches the override
  CHECK(trainer.strategy().setups == 1);
  trainer.fit(model, loader(32));
  CHECK(trainer.strategy().setups == 2);
  CHECK(trainer.combination_name() == "cpu/ddp/32-true");
}

TEST_CASE("a strategy that derives from nothing satisfies the concept and trains", "[extension]") {
  STATIC_REQUIRE(strategy<AnnouncingStrategy>);
  STATIC_REQUIRE(!std::is_base_of_v<strategy_defaults<SingleDeviceStrategy>, AnnouncingStrategy>);
  Trainer<CPUAccelerator, AnnouncingStrategy, BF16MixedPrecision> trainer(test::quiet({.max_epochs = 2}));
  test::Classifier model;
  CHECK(trainer.fit(model, loader(64), loader(32)).epochs.back().val_loss.has_value());
}

TEST_CASE("accelerators from the defaults base: the host trains, a device the machine lacks is named", "[extension]") {
  STATIC_REQUIRE(accelerator<HostAccelerator>);
  STATIC_REQUIRE(accelerator<XPUAccelerator>);
  CHECK(HostAccelerator::is_available());
  CHECK(HostAccelerator::parse_devices(1) == std::vector<int>{0});
  CHECK(HostAccelerator::parse_devices("-1") == std::vector<int>{0});
  Trainer<HostAccelerator, SingleDeviceStrategy, FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  CHECK(trainer.combination_name() == "host/single_device/32-true");
  test::Classifier model;
  CHECK(trainer.fit(model, loader(32)).global_step == 2);
  HostAccelerator host;
  CHECK(test::message_of<AcceleratorError>([&] { host.setup_device(c10::Device(c10::kMeta)); }) ==
        "Device should be host, got meta instead.");
  if (!XPUAccelerator::is_available()) {
    CHECK(XPUAccelerator::auto_device_count() == 0);
    CHECK_THAT(test::message_of<AcceleratorError>(
                   [] { Trainer<XPUAccelerator, SingleDeviceStrategy, FloatPrecision> xpu(test::quiet()); }),
               Catch::StartsWith("`xpu` can not run on your system since the accelerator is not available."));
    CHECK_THAT(test::message_of<AcceleratorError>([] { XPUAccelerator::parse_devices(1); }),
               Catch::StartsWith("You requested xpu: [0]"));
  }
}
