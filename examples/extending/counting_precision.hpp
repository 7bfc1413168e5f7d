// examples/extending/counting_precision.hpp
// A precision that changes one behaviour of "32-true": it counts the optimizer steps that ran.
#pragma once
#include <fulgur/fulgur.hpp>

struct CountingPrecision : fulgur::FloatPrecision {
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    ++steps;
    return FloatPrecision::optimizer_step(optimizer);
  }
  std::int64_t steps = 0;
};
