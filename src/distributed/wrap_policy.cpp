// Stage 3's units (include/fulgur/distributed/wrap_policy.hpp).
#include "src/distributed/wrap_policy.hpp"

#include <torch/nn/module.h>

#include <algorithm>

namespace fulgur::distributed {

namespace {
void visit(const torch::nn::Module& module, const std::string& name, bool is_root, const WrapPolicy& policy,
           WrappedUnits& out) {
  for (const auto& child : module.named_children())
    visit(*child.value(), name.empty() ? child.key() : name + "." + child.key(), false, policy, out);
  if (is_root) return;  // what is left is the root unit (0)
  std::vector<const void*> unassigned;
  std::int64_t elements = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    const void* impl = p.unsafeGetTensorImpl();
    if (out.unit_of.count(impl) != 0 || std::find(unassigned.begin(), unassigned.end(), impl) != unassigned.end())
      continue;
    unassigned.push_back(impl);
    elements += p.numel();
  }
  if (unassigned.empty()) return;
  const auto& types = policy.module_types;
  const bool by_type = std::find(types.begin(), types.end(), std::type_index(typeid(module))) != types.end();
  const bool by_size = policy.min_params > 0 && elements >= policy.min_params;
  if (!by_type && !by_size) return;
  out.names.push_back(name);
  for (const void* impl : unassigned) out.unit_of.emplace(impl, static_cast<std::int64_t>(out.names.size()));
}
}  // namespace

WrappedUnits wrap_units(const torch::nn::Module& root, const WrapPolicy& policy) {
  WrappedUnits out;
  visit(root, "", true, policy, out);
  return out;
}

}  // namespace fulgur::distributed
