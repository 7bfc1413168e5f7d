#include "fulgur/grad_norm.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <charconv>
#include <cmath>
#include <sstream>

#include "fulgur/errors.hpp"

namespace fulgur {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that read back, positional for 1e-4 <= |x| < 1e16, else d.ddde+XX.
  char digits[64];
  const auto scientific = std::to_chars(digits, digits + sizeof digits, value, std::chars_format::scientific);
  std::string sci(digits, scientific.ptr);  // "2e+00", "1.5e-05"
  const auto e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = sci.substr(0, e), exp = sci.substr(e + 1);
    const char sign = exp[0] == '-' ? '-' : '+';
    std::string magnitude = std::to_string(std::abs(exponent));
    if (magnitude.size() < 2) magnitude = "0" + magnitude;
    return mantissa + "e" + sign + magnitude;
  }
  const auto fixed = std::to_chars(digits, digits + sizeof digits, value, std::chars_format::fixed);
  std::string out(digits, fixed.ptr);
  if (out.find('.') == std::string::npos) out += ".0";
  return out;
}

GradNorms grad_norm_tensors(torch::nn::Module& module, double norm_type, std::string_view group_separator) {
  if (!(norm_type > 0))
    throw MisconfigurationError("`norm_type` must be a positive number or 'inf' (infinity norm). Got " +
                                python_float_repr(norm_type));
  GradNorms out;
  std::vector<at::Tensor> grads;
  const std::string prefix = "grad_" + python_float_repr(norm_type) + "_norm";
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined()) continue;
    out.names.push_back(prefix + std::string(group_separator) + item.key());
    grads.push_back(grad.detach());
  }
  if (grads.empty()) return out;
  // One kernel launch for all the norms (Lightning: one p.grad.norm() each); the total from them, in float32
  // as Lightning's torch.tensor(list of norms).norm(norm_type).
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, norm_type);
  for (at::Tensor& norm : norms) norm = norm.to(at::kFloat);  // bf16 or half gradients: their norms as float32
  const at::Tensor per_parameter = at::stack(norms);
  out.values = at::cat({per_parameter, per_parameter.norm(norm_type).reshape({1})});
  out.names.push_back(prefix + "_total");
  return out;
}

Metrics grad_norm(torch::nn::Module& module, double norm_type, std::string_view group_separator) {
  const GradNorms norms = grad_norm_tensors(module, norm_type, group_separator);
  Metrics out;
  if (norms.names.empty()) return out;
  const at::Tensor host = norms.values.to(at::kCPU, at::kDouble).contiguous();  // the one transfer
  const double* values = host.data_ptr<double>();
  for (std::size_t i = 0; i < norms.names.size(); ++i) out[norms.names[i]] = values[i];
  return out;
}

}  // namespace fulgur
