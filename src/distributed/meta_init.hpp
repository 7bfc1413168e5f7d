#pragma once
// A model built on the meta device (Trainer::init_module(/*empty_init=*/true) under
// ShardedStrategy<3>) has shapes and no memory; ShardedStrategy<3> gives it memory at set-up, a
// unit at a time, so that no rank ever holds the whole model:
//
//   - modules are initialised in registration order (the order their constructors ran), each by
//     ParameterInit — by default the built-in modules' own reset_parameters() — so that, with the
//     same seed, the weights equal those of the model built eagerly, bit for bit;
//   - a parameter the optimizer shards lands in its unit's bucket, which is whole only while its
//     modules are being initialised, then broadcast from rank 0 (as an eager model's weights are
//     at set-up), cut to this rank's shard and freed;
//   - any other parameter or buffer (frozen, in no optimizer) gets whole memory of its own.
//
// A weight shared by two modules (a tied embedding and head) keeps the value of the first module
// that initialises it, as `head->weight = embedding->weight` after construction does.
//
// Three built-ins construct otherwise, and are followed: MultiheadAttention initialises its out_proj
// (initialises_children); the layers of TransformerEncoder/Decoder are clones of one prototype, so
// each layer after the first draws from where the generator stood when the first began; Transformer
// redraws every matrix of its subtree (xavier_uniform_) once the subtree is built, a unit at a time.
#include <c10/core/Device.h>

#include "fulgur/strategies/sharded/options.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>

namespace torch::nn {
class Module;
}

namespace fulgur::distributed {

class OptimizerShard;
class ProcessGroup;




/// The parameters and buffers of a module that are on the meta device (their TensorImpls).
std::unordered_set<const void*> meta_tensors(const torch::nn::Module& module);


/// Gives every tensor of `pending` (TensorImpls that were meta, see meta_tensors) memory on `device`
/// and a value, as the header says; the tensors a bucket of `shards` holds must already alias it
/// (OptimizerShard built with materialize_on). Every rank calls it: it broadcasts from rank 0.
/// `pending` is emptied.
MaterializeStats materialize_meta(torch::nn::Module& root, c10::Device device, const ParameterInit& init,
                                  std::span<const std::unique_ptr<OptimizerShard>> shards, ProcessGroup& group,
                                  std::unordered_set<const void*>& pending);

}  // namespace fulgur::distributed
