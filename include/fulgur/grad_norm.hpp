#pragma once
// Lightning's grad_norm(module, norm_type) (lightning/pytorch/utilities/grads.py): each parameter's
// gradient p-norm and their total norm (the norm of all gradients as one vector), under Lightning's
// keys `grad_2.0_norm/<parameter>` and `grad_2.0_norm_total` (the norm type as Python prints a float:
// "2.0", "1.5", "inf"). Parameters without a gradient are left out. The norms are computed on the
// gradients' device with one _foreach_norm, never a host sync per parameter (Lightning's total reads
// each norm on the host): grad_norm_tensors stays there, grad_norm reads all of them in one transfer.
#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

#include "fulgur/results.hpp"

namespace torch::nn {
class Module;
}

namespace fulgur {

/// The norms, on the gradients' device: values[i] is names[i]'s, the last one the total.
struct GradNorms {
  std::vector<std::string> names;
  at::Tensor values;  ///< float32, names.size() long (empty when no parameter has a gradient)
};

/// Refuses norm_type <= 0 (NaN too) with Lightning's message. infinity: the largest absolute value.
GradNorms grad_norm_tensors(torch::nn::Module& module, double norm_type, std::string_view group_separator = "/");

/// grad_norm_tensors, read on the host in one transfer.
Metrics grad_norm(torch::nn::Module& module, double norm_type, std::string_view group_separator = "/");

/// A double as Python's repr prints it ("2.0", "0.5", "inf", "1e-05"): the norm type in the keys.
std::string python_float_repr(double value);

}  // namespace fulgur
