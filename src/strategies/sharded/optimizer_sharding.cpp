// Stage 1 of the sharded strategy, and what every stage shares: the optimizers' shards, their
// state, and the checkpoint (include/fulgur/strategies/sharded/sharding.hpp: OptimizerSharding).
#include <torch/optim/optimizer.h>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/errors.hpp"
#include "src/distributed/shard_state.hpp"
#include "src/strategies/sharded/checkpoint_format.hpp"
#include "src/strategies/sharded/state.hpp"

namespace fulgur::distributed {
namespace {

bool same_layout(const ShardLayout& a, const ShardLayout& b) {
  if (!a.bucket_params.empty() || !b.bucket_params.empty()) return a.bucket_params == b.bucket_params;
  return a.bucket_bytes == b.bucket_bytes && a.first_bucket_bytes == b.first_bucket_bytes;
}

}  // namespace

OptimizerSharding::OptimizerSharding(DataParallel& ddp) : state_(std::make_unique<State>(ddp)) {}
OptimizerSharding::~OptimizerSharding() = default;

DataParallel& OptimizerSharding::ddp() { return state_->ddp; }

void OptimizerSharding::reset() { state_->shards.clear(); }

OptimizerShard& OptimizerSharding::shard_of(const torch::optim::Optimizer& optimizer) {
  for (auto& shard : state_->shards) {
    if (shard->optimizer() != &optimizer) continue;
    // A param group added during fit (BackboneFinetuning's unfreeze) is laid out at the shard's next
    // use, on every rank alike; the check is a size comparison.
    if (shard->adds_groups()) shard->lay_out_added_groups();
    return *shard;
  }
  throw MisconfigurationError("fulgur: ShardedStrategy: this optimizer was not set up by the strategy; return it "
                              "from configure_optimizers (or pass it to setup/setup_optimizers).");
}

const std::vector<std::unique_ptr<OptimizerShard>>& OptimizerSharding::shards() const { return state_->shards; }

void OptimizerSharding::add_optimizer(torch::optim::Optimizer& optimizer) {
  const DDPOptions& o = ddp().options();
  add_optimizer(optimizer, ShardLayout{o.first_bucket_bytes, o.bucket_bytes}, /*shard_parameters=*/false);
}

void OptimizerSharding::add_optimizer(torch::optim::Optimizer& optimizer, const ShardLayout& layout,
                                      bool shard_parameters) {
  for (const auto& shard : state_->shards) {
    if (shard->optimizer() == &optimizer)
      throw MisconfigurationError("fulgur: ShardedStrategy: this optimizer is set up already.");
    for (const auto* bucket : shard->buckets())
      for (const auto& slot : bucket->slots)
        for (const auto& group : optimizer.param_groups())
          for (const auto& p : group.params())
            if (p.unsafeGetTensorImpl() == slot.param.unsafeGetTensorImpl())
              throw MisconfigurationError("fulgur: ShardedStrategy: a parameter of this optimizer is in another "
                                          "optimizer too; each parameter may belong to one optimizer only.");
  }
  state_->shards.push_back(std::make_unique<OptimizerShard>(
      ddp().group(), optimizer, layout, shard_parameters,
      shard_parameters ? std::optional<c10::Device>(ddp().device()) : std::nullopt));
}

bool OptimizerSharding::step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step) {
  OptimizerShard& shard = shard_of(optimizer);
  shard.copy_gradients();  // from the whole averaged gradients, which the loss scaler checked alike on every rank
  bool stepped = false;
  {
    auto view = shard.with_shards();
    stepped = step();
  }
  if (stepped) shard.gather_parameters();
  return stepped;
}

StateDict OptimizerSharding::optimizer_state(torch::optim::Optimizer& optimizer) {
  OptimizerShard& shard = shard_of(optimizer);
  const StateDict mine = [&] {
    auto view = shard.with_shards();
    return checkpoint::optimizer_state_dict(optimizer);
  }();
  StateDict out;
  out.insert("format", std::string(sharded_optimizer_format));
  out.insert("world_size", static_cast<std::int64_t>(ddp().environment().world_size));
  const ShardLayout& layout = shard.layout();
  if (layout.bucket_params.empty()) {
    out.insert("bucket_bytes", static_cast<std::int64_t>(layout.bucket_bytes));
    out.insert("first_bucket_bytes", static_cast<std::int64_t>(layout.first_bucket_bytes));
  } else {
    out.insert("bucket_params", c10::List<std::int64_t>(layout.bucket_params));
  }
  out.insert("shard", mine.at("archive"));
  return out;
}

void OptimizerSharding::load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state) {
  OptimizerShard& shard = shard_of(optimizer);
  const ShardLayout& layout = shard.layout();
  const int world = ddp().environment().world_size, rank = ddp().environment().rank;
  const bool sharded = state.contains("format") && state.at("format").isString() &&
                       state.at("format").toStringRef() == sharded_optimizer_format;
  if (!sharded) {  // the whole state: loaded as it was written, then cut into this rank's shards
    checkpoint::load_optimizer_state_dict(optimizer, state);
    fulgur::detail::check_optimizer_state_shapes(optimizer);
    ShardedOptimizerState::from_whole(optimizer, layout).load_shards(optimizer, shard.shards(), world, rank);
    auto view = shard.with_shards();
    fulgur::detail::check_optimizer_state_shapes(optimizer);
    return;
  }
  const ShardLayout saved = sharded_layout(state);
  if (!same_layout(saved, layout)) {  // other buckets (sizes, or stage 3's units): through the whole state
    ShardedOptimizerState(optimizer, sharded_archives(state), saved).load_whole(optimizer);
    fulgur::detail::check_optimizer_state_shapes(optimizer);
    ShardedOptimizerState::from_whole(optimizer, layout).load_shards(optimizer, shard.shards(), world, rank);
  } else if (state.at("world_size").toInt() != world) {  // another world size: resharded
    ShardedOptimizerState(optimizer, sharded_archives(state), layout).load_shards(optimizer, shard.shards(), world, rank);
  } else {  // this rank's file only
    StateDict mine;
    mine.insert("format", std::string("libtorch-optimizer-archive"));
    mine.insert("archive", sharded_archives(state, rank).at(static_cast<std::size_t>(rank)));
    auto view = shard.with_shards();
    checkpoint::load_optimizer_state_dict(optimizer, mine);
  }
  auto view = shard.with_shards();
  fulgur::detail::check_optimizer_state_shapes(optimizer);
}

void OptimizerSharding::save_checkpoint(const std::string& path, const StateDict& state) {
  write_sharded_checkpoint(ddp(), path, state);
}

}  // namespace fulgur::distributed
