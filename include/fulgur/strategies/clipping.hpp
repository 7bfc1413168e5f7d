#pragma once
// Gradient clipping exactly as torch.nn.utils.clip_grad_norm_ / clip_grad_value_ compute it
// (foreach norms per device and dtype, the norm of the norms, max_norm / (total + 1e-6) clamped
// at 1), without LibTorch's host sync: the total norm stays a tensor.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

/// Scales the gradients of `params` so their total norm is at most max_norm; returns the total
/// norm before clipping (a 0-dim tensor). error_if_nonfinite: throw on a NaN/inf norm (one sync).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type = 2.0,
                          bool error_if_nonfinite = false);

/// Clamps every gradient of `params` into [-clip_value, clip_value].
void clip_grad_value(const std::vector<at::Tensor>& params, double clip_value);

/// The same over gradients sharded across ranks: each rank passes its shards' gradients, and
/// `all_reduce` (in place) combines the ranks' sums of |g|^p (or maxima for the inf norm), so every
/// rank scales its shard by the coefficient of the whole.
at::Tensor clip_sharded_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type,
                                  bool error_if_nonfinite,
                                  const std::function<void(const at::Tensor&, ReduceOp)>& all_reduce);

}  // namespace fulgur
