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

namespace {
/// A host of the loops other than Trainer: every part of the loop contract (loops/host.hpp)
/// forwarded to a Trainer, each call counted by name. Were the loops to ask anything of their host
/// outside the contract, this would not compile; what they ask is counted.
template <class Inner>
class ForwardingHost {
 public:
  explicit ForwardingHost(Inner& inner) : inner_(inner), loop_services_(*this) {}

  const TrainerConfig& config() const { return count("config"), inner_.config(); }
  c10::Device device() const { return count("device"), inner_.device(); }
  int global_rank() const { return count("global_rank"), inner_.global_rank(); }
  int local_rank() const { return count("local_rank"), inner_.local_rank(); }
  int world_size() const { return count("world_size"), inner_.world_size(); }
  bool is_global_zero() const { return count("is_global_zero"), inner_.is_global_zero(); }
  void setup_module(torch::nn::Module& m, ModuleSetup use = ModuleSetup::training) {
    count("setup_module"), inner_.setup_module(m, use);
  }
  void setup_optimizers(torch::optim::Optimizer& o) { count("setup_optimizers"), inner_.setup_optimizers(o); }
  template <class L>
  decltype(auto) setup_dataloader(L& loader) {
    return count("setup_dataloader"), inner_.setup_dataloader(loader);
  }
  auto init_module() { return count("init_module"), inner_.init_module(); }
  template <class B>
  auto batch_to_device(const B& batch) {
    return count("batch_to_device"), inner_.batch_to_device(batch);
  }
  template <class B>
  auto convert_batch(const B& batch) {
    return count("convert_batch"), inner_.convert_batch(batch);
  }
  template <class D>
  auto convert_output(const D& data) {
    return count("convert_output"), inner_.convert_output(data);
  }
  auto forward_context() { return count("forward_context"), inner_.forward_context(); }
  void backward(const at::Tensor& loss, torch::nn::Module& m) { count("backward"), inner_.backward(loss, m); }
  auto no_backward_sync(torch::nn::Module& m, bool enabled) {
    return count("no_backward_sync"), inner_.no_backward_sync(m, enabled);
  }
  void unscale_gradients(torch::optim::Optimizer& o) { count("unscale_gradients"), inner_.unscale_gradients(o); }
  bool unscales_in_optimizer(torch::optim::Optimizer& o) {
    return count("unscales_in_optimizer"), inner_.unscales_in_optimizer(o);
  }
  at::Tensor clip_gradients(torch::nn::Module& m, torch::optim::Optimizer& o, const ClipGradients& c) {
    return count("clip_gradients"), inner_.clip_gradients(m, o, c);
  }
  bool optimizer_step(torch::optim::Optimizer& o) { return count("optimizer_step"), inner_.optimizer_step(o); }
  void end_training() { count("end_training"), inner_.end_training(); }
  at::Tensor all_reduce(const at::Tensor& t, ReduceOp op = ReduceOp::mean) {
    return count("all_reduce"), inner_.all_reduce(t, op);
  }
  at::Tensor all_gather(const at::Tensor& t) { return count("all_gather"), inner_.all_gather(t); }
  std::string broadcast(const std::string& text) { return count("broadcast"), inner_.broadcast(text); }
  void barrier(std::string_view name = {}) { count("barrier"), inner_.barrier(name); }
  bool reduce_boolean_decision(bool d, bool all = true) {
    return count("reduce_boolean_decision"), inner_.reduce_boolean_decision(d, all);
  }
  void save(const std::string& path, const StateDict& state) { count("save"), inner_.save(path, state); }
  StateDict load(const std::string& path) { return count("load"), inner_.load(path); }
  void remove_checkpoint(const std::string& path) { count("remove_checkpoint"), inner_.remove_checkpoint(path); }
  std::string resolve_path(const std::string& path) const { return count("resolve_path"), inner_.resolve_path(path); }
  StateDict module_state(torch::nn::Module& m) { return count("module_state"), inner_.module_state(m); }
  void load_module_state(torch::nn::Module& m, const StateDict& s, bool strict) {
    count("load_module_state"), inner_.load_module_state(m, s, strict);
  }
  StateDict optimizer_state(torch::optim::Optimizer& o) { return count("optimizer_state"), inner_.optimizer_state(o); }
  void load_optimizer_state(torch::optim::Optimizer& o, const StateDict& s) {
    count("load_optimizer_state"), inner_.load_optimizer_state(o, s);
  }
  StateDict precision_state() { return count("precision_state"), inner_.precision_state(); }
  void load_precision_state(const StateDict& s) { count("load_precision_state"), inner_.load_precision_state(s); }
  static std::string combination_name() { return "forwarded/" + Inner::combination_name(); }
  static constexpr std::string_view precision_name() { return Inner::precision_name(); }
  static constexpr bool uses_loss_scaler = Inner::uses_loss_scaler;

  int calls(const std::string& verb) const { return calls_.contains(verb) ? calls_.at(verb) : 0; }

 private:
  friend struct loops::host_access;
  void count(const std::string& verb) const { ++calls_[verb]; }

  Inner& inner_;
  mutable std::map<std::string, int> calls_;
  loops::LoopServices<ForwardingHost, fulgur::detail::CallbackSet<>> loop_services_;
};
}  // namespace

namespace {
struct PredictorImpl : test::ClassifierImpl {
  at::Tensor predict_step(const data::Batch& b, std::int64_t) { return forward(b.input); }
};
TORCH_MODULE(Predictor);
}  // namespace

TEST_CASE("the loops run on any host that keeps the loop contract, through its verbs only", "[extension][contract]") {
  using Inner = Trainer<CPUAccelerator, SingleDeviceStrategy, FP16MixedPrecision>;
  STATIC_REQUIRE(loops::loop_host<Inner>);
  STATIC_REQUIRE(loops::loop_host<ForwardingHost<Inner>>);
  STATIC_REQUIRE_FALSE(loops::loop_host<CPUAccelerator>);
  const std::string dir = test::scratch_folder("forwarding_host");
  auto train = loader(64), val = loader(32);
  Inner inner(test::quiet({.max_epochs = 2, .gradient_clip_val = 1.0, .seed = 3, .default_root_dir = dir}));
  ForwardingHost<Inner> host(inner);
  test::Classifier forwarded;
  const FitResult result = loops::fit(host, *forwarded, train, val, {});
  CHECK(result.global_step == 8);
  CHECK(host.calls("optimizer_step") == 8);
  CHECK(host.calls("backward") == 8);
  CHECK(host.calls("clip_gradients") == 8);
  CHECK(host.calls("end_training") == 1);
  CHECK(host.calls("save") == 0);
  // The same run on the Trainer itself: the same weights, bit for bit.
  Inner direct_trainer(test::quiet({.max_epochs = 2, .gradient_clip_val = 1.0, .seed = 3, .default_root_dir = dir}));
  test::Classifier direct;
  direct_trainer.fit(direct, train, val);
  CHECK(torch::equal(forwarded->fc1->weight, direct->fc1->weight));
  // The one-off paths go through the contract too: a checkpoint of the host's fit, and a resume.
  loops::host_access::services(host).fit()->request_save(dir + "/host.ckpt", /*weights_only=*/false);
  CHECK(host.calls("save") == 1);
  CHECK(host.calls("module_state") == 1);
  CHECK(host.calls("optimizer_state") == 1);
  CHECK(host.calls("precision_state") == 1);
  const TrainerConfig longer = test::quiet({.max_epochs = 3, .gradient_clip_val = 1.0, .seed = 3, .default_root_dir = dir});
  Inner resuming_trainer(longer);
  ForwardingHost<Inner> again(resuming_trainer);
  test::Classifier resumed;
  loops::fit(again, *resumed, train, val, {.ckpt_path = dir + "/host.ckpt"});
  CHECK(again.calls("load") == 1);
  CHECK(again.calls("load_module_state") == 1);
  CHECK(again.calls("load_optimizer_state") == 1);
  CHECK(again.calls("load_precision_state") == 1);
  Inner straight_trainer(longer);
  test::Classifier straight;
  straight_trainer.fit(straight, train, val);
  CHECK(torch::equal(resumed->fc2->weight, straight->fc2->weight));
  const EvaluationResult tested = loops::evaluate<loops::Test>(host, *forwarded, val);
  CHECK(tested.loss.has_value());
  Predictor predictor;
  CHECK(loops::predict(host, *predictor, val).size() == 2);
  CHECK(host.calls("convert_output") == 2);
}
