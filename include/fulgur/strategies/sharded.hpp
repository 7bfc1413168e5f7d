#pragma once
// ShardedStrategy<Stage> — ZeRO-style sharded data parallelism (Lightning's "deepspeed_stage_N"
// and "fsdp"), one class per stage (strategies/sharded/stage*.hpp) over a shared base (base.hpp):
//   ShardedStrategy<1> ("deepspeed_stage_1"): the optimizer state sharded;
//   ShardedStrategy<2> ("deepspeed_stage_2"): and the gradients;
//   ShardedStrategy<3> ("fsdp"): and the parameters, gathered a WrapPolicy unit at a time.
// Processes, devices, options (DDPOptions; stage 3: FSDPOptions) and every collective are
// DDPStrategy's. What depends on neither the precision nor the accelerator is compiled once in
// libfulgur (sharded/sharding.hpp); a checkpoint is a manifest and each rank's shards beside it,
// which any run reads (checkpoint/format.hpp).
#include "fulgur/strategies/sharded/base.hpp"
#include "fulgur/strategies/sharded/options.hpp"
#include "fulgur/strategies/sharded/stage1.hpp"
#include "fulgur/strategies/sharded/stage2.hpp"
#include "fulgur/strategies/sharded/stage3.hpp"

namespace fulgur {

/// Any other stage: a type that exists, so that naming it is this one error.
template <int Stage, class Backend>
class ShardedStrategy : public ShardedStrategy<1, Backend> {
 public:
  ShardedStrategy(DDPOptions options = {}) : ShardedStrategy<1, Backend>(options) {
    static_assert(Stage >= 1 && Stage <= 3,
                  "fulgur: ShardedStrategy<Stage>: the stages are 1 (optimizer state sharded), 2 (and gradients) "
                  "and 3 (and parameters).");
  }
};

}  // namespace fulgur
