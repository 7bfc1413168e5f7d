// Gradient clipping (include/fulgur/strategies/clipping.hpp).
#include "fulgur/strategies/clipping.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "fulgur/errors.hpp"

namespace fulgur {

namespace {
struct GradsOfOneKind {
  c10::Device device;
  c10::ScalarType dtype;
  std::vector<at::Tensor> grads;
};

/// The defined gradients of `params`, grouped by device and dtype (one foreach call per group).
std::vector<GradsOfOneKind> group_grads(const std::vector<at::Tensor>& params) {
  std::vector<GradsOfOneKind> groups;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const GradsOfOneKind& k) { return k.device == g.device() && k.dtype == g.scalar_type(); });
    if (it == groups.end()) {
      groups.push_back({g.device(), g.scalar_type(), {}});
      it = std::prev(groups.end());
    }
    it->grads.push_back(g);
  }
  return groups;
}
}  // namespace

/// Scales the gradients of `params` so their total norm is at most max_norm; returns the total
/// norm before clipping (a 0-dim tensor). error_if_nonfinite: throw on a NaN/inf norm (one sync).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type,
                          bool error_if_nonfinite) {
  auto groups = group_grads(params);
  if (groups.empty()) return at::zeros({});
  const c10::Device first_device = groups.front().device;
  std::vector<at::Tensor> norms;
  for (const auto& group : groups)
    for (auto& n : at::_foreach_norm(group.grads, norm_type)) norms.push_back(n.to(first_device));
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
  if (error_if_nonfinite && at::logical_or(total.isnan(), total.isinf()).item<bool>())
    throw Error("The total norm of order " + std::to_string(norm_type) +
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error "
                "and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& group : groups) at::_foreach_mul_(group.grads, coef.to(group.device));
  return total;
}

at::Tensor clip_sharded_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type,
                                  bool error_if_nonfinite,
                                  const std::function<void(const at::Tensor&, ReduceOp)>& all_reduce) {
  const bool inf = std::isinf(norm_type);
  const c10::ScalarType dtype = grads.front().scalar_type();
  std::vector<at::Tensor> parts;
  for (const auto& n : at::_foreach_norm(grads, norm_type)) parts.push_back(n.to(dtype));
  const at::Tensor norms = at::stack(parts);
  at::Tensor local = inf ? norms.max() : norms.pow(norm_type).sum();  // this rank's share
  all_reduce(local, inf ? ReduceOp::max : ReduceOp::sum);
  at::Tensor total = inf ? local : local.pow(1.0 / norm_type);  // returned: moved
  if (error_if_nonfinite && at::logical_or(total.isnan(), total.isinf()).item<bool>())
    throw Error("The total norm of order " + std::to_string(norm_type) +
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error "
                "and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

/// Clamps every gradient of `params` into [-clip_value, clip_value].
void clip_grad_value(const std::vector<at::Tensor>& params, double clip_value) {
  for (auto& group : group_grads(params)) {
    at::_foreach_clamp_min_(group.grads, -clip_value);
    at::_foreach_clamp_max_(group.grads, clip_value);
  }
}

}  // namespace fulgur
