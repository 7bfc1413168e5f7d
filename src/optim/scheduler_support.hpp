#pragma once
// What fulgur::optim's schedulers (src/optim/*.cpp) share: Python's integer arithmetic, reading a state_dict's
// entries with a clear error, Python's errors, and where a param group keeps its momentum. Private to src/optim.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <numbers>
#include <string>
#include <typeinfo>
#include <vector>

#include <c10/util/Type.h>

#include "fulgur/detail/describe.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/optim/lr_scheduler.hpp"

namespace fulgur::optim::scheduler_support {

constexpr double kPi = std::numbers::pi;  // math.pi

/// Python's a % b for b > 0 (never negative).
inline std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  const std::int64_t r = a % b;
  return r < 0 ? r + b : r;
}
/// Python's a // b for b > 0.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) { return (a - floor_mod(a, b)) / b; }

inline c10::IValue doubles(const std::vector<double>& values) { return c10::List<double>(values); }

[[noreturn]] inline void bad_state(const std::string& key, const std::string& why) {
  throw CheckpointError("fulgur: the scheduler state's '" + key + "' " + why +
                        "; pass what state_dict() of the same kind of scheduler returned.");
}

inline c10::IValue entry(const StateDict& state, const std::string& key) {
  if (!state.contains(key)) bad_state(key, "is missing");
  return state.at(key);
}

inline std::int64_t int_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  if (!value.isInt()) bad_state(key, "is a " + std::string(value.tagKind()) + ", not an integer");
  return value.toInt();
}

inline double double_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  bad_state(key, "is a " + std::string(value.tagKind()) + ", not a number");
}

inline std::vector<double> doubles_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  std::vector<double> out;
  if (value.isDoubleList()) {
    for (double v : value.toDoubleList()) out.push_back(v);
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) {
      if (v.isDouble()) out.push_back(v.toDouble());
      else if (v.isInt()) out.push_back(static_cast<double>(v.toInt()));
      else bad_state(key, "holds a " + std::string(v.tagKind()) + ", not a number");
    }
  } else {
    bad_state(key, "is a " + std::string(value.tagKind()) + ", not a list of numbers");
  }
  return out;
}

[[noreturn]] inline void refuse(const std::string& text) { throw MisconfigurationError(text); }

/// A param group added after the scheduler was made, which a schedule kept per group cannot take (PyTorch
/// raises there too, with `python`): what happened and what to do.
[[noreturn]] inline void refuse_added_group(const std::string& kind, std::size_t groups, std::size_t known,
                                     const std::string& python) {
  refuse(kind + ": the optimizer has " + std::to_string(groups) + " param groups and this scheduler's schedule " +
         "holds " + std::to_string(known) + ", those it was made with: a group was added to the optimizer after it "
         "was made (as BackboneFinetuning's unfreeze adds the backbone's). PyTorch's " + kind + " fails there too (" +
         python + "). Make the scheduler after the last add_param_group; where a group is added during fit "
         "(BackboneFinetuning), use one that scales each group's own lr: StepLR, MultiStepLR, ExponentialLR, LinearLR, "
         "or CosineAnnealingLR within its first T_max steps (docs/optimizers.md).");
}

inline std::string kind_of(const LRScheduler& scheduler) {
  const std::string name = c10::demangle(typeid(scheduler).name());
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

using ::fulgur::detail::number_text;  // what an ostream's default writes: "%g"

/// Where a param group keeps its momentum: SGD's and RMSprop's `momentum`, Adam's and AdamW's beta1.
struct MomentumOf {
  torch::optim::OptimizerOptions& options;
  void set(double value) const {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) sgd->momentum(value);
    else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) rms->momentum(value);
    else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options))
      adam->betas({value, std::get<1>(adam->betas())});
    else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options))
      adamw->betas({value, std::get<1>(adamw->betas())});
  }
};

/// Python's `"momentum" in optimizer.defaults` (SGD, RMSprop) and `"betas" in optimizer.defaults` (Adam, AdamW).
inline bool has_momentum(torch::optim::Optimizer& optimizer) {
  torch::optim::OptimizerOptions& defaults = optimizer.defaults();
  return dynamic_cast<torch::optim::SGDOptions*>(&defaults) != nullptr ||
         dynamic_cast<torch::optim::RMSpropOptions*>(&defaults) != nullptr;
}
inline bool has_beta1(torch::optim::Optimizer& optimizer) {
  torch::optim::OptimizerOptions& defaults = optimizer.defaults();
  return dynamic_cast<torch::optim::AdamOptions*>(&defaults) != nullptr ||
         dynamic_cast<torch::optim::AdamWOptions*>(&defaults) != nullptr;
}

}  // namespace fulgur::optim::scheduler_support
