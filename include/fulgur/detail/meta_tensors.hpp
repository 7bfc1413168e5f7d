#pragma once
// Tensors on the meta device (shapes without memory): a model built in init_module(/*empty_init=*/
// true) has them until a strategy that materialises modules gives them memory at set-up.
#include <string>

namespace torch::nn {
class Module;
}

namespace fulgur::detail {

/// The qualified name of the module's first parameter or buffer on the meta device, or empty.
std::string first_meta_tensor(const torch::nn::Module& module);

/// Throws MisconfigurationError naming the module's first meta tensor, followed by `advice`, if it has any.
void refuse_meta_tensors(const torch::nn::Module& module, const std::string& advice);

}  // namespace fulgur::detail
