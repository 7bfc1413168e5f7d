#pragma once
// fulgur::ActivationCheckpointing: which submodules run under activation_checkpoint, chosen by type
// (Lightning's activation_checkpointing_policy={Block}). LibTorch modules have no forward hooks and
// forward is not virtual, so nothing can wrap a block from outside: the model calls its blocks
// through the policy (`x = checkpointing(block, x)` instead of `x = block(x)`), and the policy
// checkpoints the types it names, each module's own parameters being the node's parameters (no
// graph is built in the forward). It composes with every strategy: under ShardedStrategy<3> the
// recomputation reads the unit's parameters again, so the unit is gathered again for it and
// released after, as FSDP does. docs/activation_checkpointing.md.
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fulgur/detail/module_type.hpp"
#include "fulgur/nn/activation_checkpoint.hpp"

namespace fulgur {

class ActivationCheckpointing {
 public:
  /// Checkpoints nothing (every module called through it just runs its forward).
  ActivationCheckpointing() = default;
  /// Checkpoints the modules of these types (BlockImpl, or its holder Block).
  template <class... Modules>
  static ActivationCheckpointing by_type() {
    ActivationCheckpointing policy;
    policy.types_ = {std::type_index(typeid(detail::contained_t<Modules>))...};
    return policy;
  }
  /// Checkpoints every module called through it.
  static ActivationCheckpointing every_module() {
    ActivationCheckpointing policy;
    policy.every_ = true;
    return policy;
  }

  bool applies_to(const torch::nn::Module& module) const {
    return every_ || std::find(types_.begin(), types_.end(), std::type_index(typeid(module))) != types_.end();
  }

  /// module->forward(inputs...), checkpointed when the policy names the module's type and grad mode
  /// is on. module is a TORCH_MODULE holder or a std::shared_ptr to the module.
  template <class Holder, class... Args>
  auto operator()(Holder& module, Args&&... inputs) const
      -> std::remove_cvref_t<decltype((*module).forward(std::forward<Args>(inputs)...))> {
    if (applies_to(*module) && torch::autograd::GradMode::is_enabled())
      return checkpoint_module(module, std::forward<Args>(inputs)...);
    return (*module).forward(std::forward<Args>(inputs)...);
  }

 private:
  std::vector<std::type_index> types_;
  bool every_ = false;
};

}  // namespace fulgur
