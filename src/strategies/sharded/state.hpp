#pragma once
// What each stage of the sharded strategy keeps (include/fulgur/strategies/sharded/sharding.hpp).
// Private to libfulgur.
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fulgur/strategies/sharded/sharding.hpp"
#include "src/distributed/optimizer_shard.hpp"
#include "src/distributed/parameter_gatherer.hpp"
#include "src/distributed/sharded_reducer.hpp"
#include "src/distributed/wrap_policy.hpp"

namespace fulgur::distributed {

struct OptimizerSharding::State {
  explicit State(DataParallel& ddp_) : ddp(ddp_) {}
  DataParallel& ddp;
  std::vector<std::unique_ptr<OptimizerShard>> shards;
};

struct GradientSharding::Gradients {
  std::vector<std::pair<std::string, at::Tensor>> named_parameters;  // the module's, for errors
  std::unique_ptr<ShardedGradientReducer> reducer;
};

struct ParameterSharding::Parameters {
  FSDPOptions options;
  WrappedUnits units;                        // of the module set up
  torch::nn::Module* module = nullptr;       // the module set up
  std::unordered_set<const void*> meta_pending;  // its tensors still on the meta device
  MaterializeStats materialized;
  std::unique_ptr<ParameterGatherer> gatherer;  // destroyed first (~ParameterSharding)
};

}  // namespace fulgur::distributed
