#pragma once
#include <ATen/core/Tensor.h>

namespace fulgur::data {

/// One batch of a supervised data set: the model's input and the target it is compared with.
struct Batch {
  at::Tensor input{};
  at::Tensor target{};
};

}  // namespace fulgur::data
