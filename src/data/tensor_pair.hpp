#pragma once
// What TensorLoader and TensorDataset both check of their inputs and targets (private to libfulgur).
#include <ATen/core/Tensor.h>

namespace fulgur::data::detail {

/// Defined, with a first (sample) dimension, the same number of samples; a DataError naming `who`.
void check_tensor_pair(const char* who, const at::Tensor& inputs, const at::Tensor& targets);

}  // namespace fulgur::data::detail
