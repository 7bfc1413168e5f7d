#pragma once
// Gradient clipping exactly as torch.nn.utils.clip_grad_norm_ / clip_grad_value_ compute it
// (foreach norms per device and dtype, the norm of the norms, max_norm / (total + 1e-6) clamped
// at 1), without LibTorch's host sync: the total norm stays a tensor.
#include <ATen/ATen.h>

#include <vector>

namespace fulgur {

/// Scales the gradients of `params` so their total norm is at most max_norm; returns the total
/// norm before clipping (a 0-dim tensor). error_if_nonfinite: throw on a NaN/inf norm (one sync).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type = 2.0,
                          bool error_if_nonfinite = false);

/// Clamps every gradient of `params` into [-clip_value, clip_value].
void clip_grad_value(const std::vector<at::Tensor>& params, double clip_value);

}  // namespace fulgur
