// A policy that misses one member, given to the real Trainer and used as a user would (fit,
// validate, the Fabric verbs): exactly one error, which names the member. The twin has the member.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#if defined(FULGUR_RULE_STRATEGY)
// A strategy written from the defaults base that deleted the optimizer step it meant to rewrite.
struct Strategy : fulgur::strategy_defaults<Strategy> {
  static constexpr std::string_view name = "mine";
#ifdef FULGUR_COMPILE_FAIL
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer&, Precision&) = delete;
#endif
};
using Accelerator = fulgur::CPUAccelerator;
using Precision = fulgur::FloatPrecision;
#elif defined(FULGUR_RULE_PRECISION)
// A precision whose optimizer_step forgot to say whether the step ran.
struct Precision : fulgur::FloatPrecision {
#ifdef FULGUR_COMPILE_FAIL
  void optimizer_step(torch::optim::Optimizer& optimizer) { optimizer.step(); }
#endif
};
using Accelerator = fulgur::CPUAccelerator;
using Strategy = fulgur::SingleDeviceStrategy;
#elif defined(FULGUR_RULE_ACCELERATOR)
// An accelerator the Trainer cannot default-construct.
struct Accelerator : fulgur::accelerator_defaults<Accelerator> {
  static constexpr std::string_view name = "host";
  static constexpr c10::DeviceType device_type = c10::kCPU;
#ifdef FULGUR_COMPILE_FAIL
  explicit Accelerator(int) {}
#endif
};
using Strategy = fulgur::SingleDeviceStrategy;
using Precision = fulgur::FloatPrecision;
#elif defined(FULGUR_RULE_OPTIONAL_STRATEGY)
// A strategy that means to unscale gradients of its own (as sharded stage 2 does) but forgot the
// precision: without the declared optional members, fulgur would never call it, and say nothing.
struct Strategy : fulgur::strategy_defaults<Strategy> {
  static constexpr std::string_view name = "mine";
#ifdef FULGUR_COMPILE_FAIL
  void unscale_gradients(torch::optim::Optimizer&) {}
#else
  template <class Precision>
  void unscale_gradients(torch::optim::Optimizer& optimizer, Precision& precision) {
    precision.unscale_gradients(optimizer);
  }
#endif
};
using Accelerator = fulgur::CPUAccelerator;
using Precision = fulgur::FloatPrecision;
#elif defined(FULGUR_RULE_OPTIONAL_PRECISION)
// A precision whose "uses_scaler" is a run-time flag: the loops decide at compile time.
struct Precision : fulgur::FloatPrecision {
#ifdef FULGUR_COMPILE_FAIL
  static inline bool uses_scaler = false;
#else
  static constexpr bool uses_scaler = false;
#endif
};
using Accelerator = fulgur::CPUAccelerator;
using Strategy = fulgur::SingleDeviceStrategy;
#elif defined(FULGUR_RULE_OPTIONAL_ACCELERATOR)
// An accelerator that asks the device about a precision's dtype by the precision's name: the
// Trainer's check (a bfloat16 run on a GPU without bfloat16) would never have been made.
struct Accelerator : fulgur::accelerator_defaults<Accelerator> {
  static constexpr std::string_view name = "host";
  static constexpr c10::DeviceType device_type = c10::kCPU;
#ifdef FULGUR_COMPILE_FAIL
  static bool supports_dtype(const c10::Device&, std::string_view precision) { return precision != "bf16-mixed"; }
#else
  static bool supports_dtype(const c10::Device&, c10::ScalarType dtype) { return dtype != c10::kBFloat16; }
#endif
};
using Strategy = fulgur::SingleDeviceStrategy;
using Precision = fulgur::BF16MixedPrecision;
#else
#error "define one FULGUR_RULE_*"
#endif

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  at::Tensor validation_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  at::Tensor predict_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc{2, 1};
};

int train() {
  fulgur::Trainer<Accelerator, Strategy, Precision> trainer({.max_epochs = 1});
  auto net = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(at::ones({4, 2}), at::ones({4}));
  const fulgur::FitResult result = trainer.fit(net, loader, loader);
  const fulgur::EvaluationResult validated = trainer.validate(net, loader);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  trainer.setup(net, optimizer);
  trainer.backward(net->fc(at::ones({1, 2})).sum());
  const bool stepped = trainer.optimizer_step(optimizer);
  std::size_t predicted = trainer.predict(net, loader).size();  // used as a caller uses predictions
  for (const auto& p : trainer.predict(net, loader)) predicted += static_cast<std::size_t>(p.size(0));
  return static_cast<int>(result.global_step) + static_cast<int>(validated.metrics.size()) + stepped +
         static_cast<int>(predicted);
}
