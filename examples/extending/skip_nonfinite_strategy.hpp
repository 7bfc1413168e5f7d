// examples/extending/skip_nonfinite_strategy.hpp
// A strategy that changes one behaviour: an optimizer step whose gradients hold NaN or inf is
// skipped, under any precision, as a loss scaler does under '16-mixed'. Returning false tells fit
// the step did not run (it is counted, and the learning rate is left alone). Everything else is
// strategy_defaults' single-device behaviour.
#pragma once
#include <fulgur/fulgur.hpp>

struct SkipNonFiniteStrategy : fulgur::strategy_defaults<SkipNonFiniteStrategy> {
  static constexpr std::string_view name = "skip_nonfinite";
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    for (const auto& p : precision.main_params(optimizer))
      if (p.grad().defined() && !p.grad().isfinite().all().template item<bool>()) return false;
    return strategy_defaults::optimizer_step(optimizer, precision);
  }
};
