#pragma once
// TrainerConfig::detect_anomaly under ShardedStrategy<2> and <3>, whose module keeps no gradient after
// backward (each rank holds its shard of them): the check before an optimizer step asks the sharding
// that laid the module out. Private to libfulgur (src/loops/common.cpp calls it).
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fulgur::distributed {

class OptimizerShard;
class ProcessGroup;

/// What set_module registers for its module: the names below, for its own shards.
using NonFiniteGradientNames = std::function<std::vector<std::string>()>;
void remember_sharded_module(const torch::nn::Module& module, const void* owner, NonFiniteGradientNames names);
/// Called when `owner` lays its module out anew or is destroyed.
void forget_sharded_modules(const void* owner);

/// Each named parameter's part of this rank's shards of the gradients checked, the flags then
/// all-reduced (max) over `group`.
std::vector<std::string> non_finite_gradient_names(const std::vector<std::unique_ptr<OptimizerShard>>& shards,
                                                   const std::vector<std::pair<std::string, at::Tensor>>& named,
                                                   ProcessGroup& group);

/// The names of `module`'s parameters whose gradient is NaN or infinite in any rank's shard (one
/// all-reduce: every rank of the module's group gets the same names, and must call this alike);
/// nullopt when `module` is not laid out by a stage-2 or stage-3 sharding (its .grad are whole).
std::optional<std::vector<std::string>> sharded_non_finite_gradients(const torch::nn::Module& module);

}  // namespace fulgur::distributed
