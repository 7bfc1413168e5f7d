#pragma once
// Pieces the precision policies share.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <vector>

#include "fulgur/data/apply.hpp"

namespace fulgur::detail {

/// Every parameter of every parameter group: the tensors that clipping acts on.
std::vector<at::Tensor> all_params(torch::optim::Optimizer& optimizer);

/// Casts floating-point tensors to dtype; integer, bool and complex tensors pass through.
template <class Data>
auto convert_floating(const Data& data, c10::ScalarType dtype) {
  return data::map_tensors(data, [dtype](const at::Tensor& t) {
    return t.defined() && t.is_floating_point() && t.scalar_type() != dtype ? t.to(dtype) : t;
  });
}

}  // namespace fulgur::detail
