// detail::first_meta_tensor and refuse_meta_tensors (include/fulgur/detail/meta_tensors.hpp).
#include "fulgur/detail/meta_tensors.hpp"

#include <torch/nn/module.h>

#include "fulgur/errors.hpp"

namespace fulgur::detail {

std::string first_meta_tensor(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters())
    if (item.value().defined() && item.value().is_meta()) return item.key();
  for (const auto& item : module.named_buffers())
    if (item.value().defined() && item.value().is_meta()) return item.key();
  return {};
}

void refuse_meta_tensors(const torch::nn::Module& module, const std::string& advice) {
  const std::string name = first_meta_tensor(module);
  if (!name.empty())
    throw MisconfigurationError("fulgur: the module's tensor '" + name +
                                "' is on the meta device (a shape without memory or value); " + advice);
}

}  // namespace fulgur::detail
