#pragma once
// ShardedStrategy<Stage> — ZeRO-style sharded data parallelism (Lightning's "deepspeed_stage_N").
//   ShardedStrategy<1>: DDP whose ranks each keep the optimizer state of 1/N of the parameters
//   ("deepspeed_stage_1"). Gradients are averaged while backward runs, as under DDPStrategy; the
//   optimizer then steps this rank's shard of the flat parameters and the shards are all-gathered
//   (distributed/optimizer_shard.hpp). Unscaling, clipping, zero_grad and toggle_optimizer see the
//   module's whole gradients, as under DDP, so stage 1 trains as DDP does, bit for bit, with any
//   element-wise torch::optim optimizer (SGD, Adam, AdamW, Adagrad, RMSprop).
//   Stages 2 (gradients sharded too) and 3 (parameters too, "fsdp") are not there yet.
// Processes, devices, options (DDPOptions) and every collective are DDPStrategy's.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/distributed/optimizer_shard.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/ddp.hpp"

namespace fulgur {

template <int Stage, class Backend = backend::Auto>
class ShardedStrategy : public BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>> {
  using Base = BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>>;

 public:
  static constexpr std::string_view name = "deepspeed_stage_1";
  // Not explicit, as DDPStrategy's. The stage is checked here rather than in the class body, so
  // that asking for another one is this one error (the class stays a well-formed type).
  ShardedStrategy(DDPOptions options = {}) : Base(options) {
    static_assert(Stage == 1,
                  "fulgur: ShardedStrategy<2> and <3> (gradients, then parameters sharded too) are not implemented "
                  "yet; use ShardedStrategy<1> (optimizer state sharded) or DDPStrategy.");
  }

  /// A module set up again starts afresh: its optimizers are set up after it.
  void setup_module(torch::nn::Module& module) {
    shards_.clear();
    Base::setup_module(module);
  }
  /// Re-points the optimizer at this rank's shards (it must hold no state yet).
  void setup_optimizer(torch::optim::Optimizer& optimizer) {
    if (find_shard(optimizer) != nullptr)
      throw MisconfigurationError("fulgur: ShardedStrategy: this optimizer is set up already.");
    shards_.push_back(std::make_unique<distributed::OptimizerShard>(this->group(), optimizer));
  }

  /// Steps this rank's shard (the loss scaler unscales and checks the whole gradients first, which
  /// are the same on every rank, so all skip alike), then gathers every rank's.
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    distributed::OptimizerShard& shard = shard_of(optimizer);
    precision.unscale_gradients(optimizer);
    shard.copy_gradients();
    bool stepped = false;
    {
      auto view = shard.with_shards();
      stepped = precision.optimizer_step(optimizer);
    }
    if (stepped) shard.gather_parameters();
    return stepped;
  }

  /// Every rank's shard of the optimizer state (LibTorch's archive of its optimizer over the shard),
  /// gathered: {"format": "fulgur-sharded-optimizer", "world_size", "shards": [one per rank]}.
  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) {
    const StateDict mine = [&] {
      auto view = shard_of(optimizer).with_shards();
      return checkpoint::optimizer_state_dict(optimizer);
    }();
    const auto parts = this->all_gather_uneven(mine.at("archive").toTensor().to(this->root_device()));
    c10::impl::GenericList shards(c10::TensorType::get());
    for (const auto& part : parts) shards.push_back(part.cpu());
    StateDict out;
    out.insert("format", std::string(sharded_format));
    out.insert("world_size", static_cast<std::int64_t>(this->world_size()));
    out.insert("shards", shards);
    return out;
  }
  /// This rank's shard of a state from get_optimizer_state, written by as many ranks.
  void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
    if (!state.contains("format") || !state.at("format").isString() || state.at("format").toStringRef() != sharded_format)
      throw CheckpointError("fulgur: ShardedStrategy: the optimizer state is not a sharded one (it was written under "
                            "another strategy); resume under the strategy that wrote it, or load only the weights "
                            "(checkpoint::module_weights).");
    const std::int64_t world = state.at("world_size").toInt();
    if (world != this->world_size())
      throw CheckpointError("fulgur: ShardedStrategy: the optimizer state was sharded over " + std::to_string(world) +
                            " ranks, this run has " + std::to_string(this->world_size()) +
                            "; resume on as many ranks.");
    StateDict mine;
    mine.insert("format", std::string("libtorch-optimizer-archive"));
    mine.insert("archive", state.at("shards").toList().get(static_cast<std::size_t>(this->global_rank())).toTensor());
    auto view = shard_of(optimizer).with_shards();
    checkpoint::load_optimizer_state_dict(optimizer, mine);
    detail::check_optimizer_state_shapes(optimizer);
  }

  /// What the optimizers hold, per rank: elements of the shards they step, and of the whole.
  const std::vector<std::unique_ptr<distributed::OptimizerShard>>& optimizer_shards() const { return shards_; }

  void teardown() {
    shards_.clear();
    Base::teardown();
  }

 private:
  static constexpr std::string_view sharded_format = "fulgur-sharded-optimizer";

  distributed::OptimizerShard* find_shard(const torch::optim::Optimizer& optimizer) {
    for (auto& shard : shards_)
      if (shard->optimizer() == &optimizer) return shard.get();
    return nullptr;
  }
  distributed::OptimizerShard& shard_of(const torch::optim::Optimizer& optimizer) {
    if (auto* shard = find_shard(optimizer)) return *shard;
    throw MisconfigurationError("fulgur: ShardedStrategy: this optimizer was not set up by the strategy; return it "
                                "from configure_optimizers (or pass it to setup/setup_optimizers).");
  }

  std::vector<std::unique_ptr<distributed::OptimizerShard>> shards_;
};

}  // namespace fulgur
