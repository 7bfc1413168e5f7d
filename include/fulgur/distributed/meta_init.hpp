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

/// Initialises one module's own parameters and buffers in place (not its children's); called for
/// each module that has any, in registration order. Return false for a module it does not know:
/// the set-up then stops with an error that names it.
using ParameterInit = std::function<bool(torch::nn::Module&)>;

/// How LibTorch's built-in modules with parameters initialise them at construction: reset_parameters()
/// (Linear, Bilinear, Conv and ConvTranspose 1d–3d, Embedding, EmbeddingBag, LayerNorm, GroupNorm,
/// BatchNorm and InstanceNorm 1d–3d, RNN, LSTM, GRU and their cells), PReLU's constant, and
/// MultiheadAttention's out_proj then its own projections; false for any other type. The layers of
/// TransformerEncoder/Decoder and Transformer's final redraw are materialize_meta's (see there).
bool reset_builtin_parameters(torch::nn::Module& module);

/// Modules whose initialisation covers their children (MultiheadAttention: its out_proj): ParameterInit
/// is called for the module with every tensor of its subtree given memory, and not for the children.
bool initialises_children(const torch::nn::Module& module);

/// The qualified name of the module's first parameter or buffer on the meta device, or empty.
std::string first_meta_tensor(const torch::nn::Module& module);

/// Throws MisconfigurationError naming the module's first meta tensor, followed by `advice`, if it has any.
void refuse_meta_tensors(const torch::nn::Module& module, const std::string& advice);

/// The parameters and buffers of a module that are on the meta device (their TensorImpls).
std::unordered_set<const void*> meta_tensors(const torch::nn::Module& module);

struct MaterializeStats {
  std::int64_t modules = 0;     ///< modules initialised
  std::int64_t peak_bytes = 0;  ///< most bytes whole at once: open buckets plus tensors kept whole
  std::int64_t whole_bytes = 0; ///< bytes of the tensors kept whole (in no bucket)
};

/// Gives every tensor of `pending` (TensorImpls that were meta, see meta_tensors) memory on `device`
/// and a value, as the header says; the tensors a bucket of `shards` holds must already alias it
/// (OptimizerShard built with materialize_on). Every rank calls it: it broadcasts from rank 0.
/// `pending` is emptied.
MaterializeStats materialize_meta(torch::nn::Module& root, c10::Device device, const ParameterInit& init,
                                  std::span<const std::unique_ptr<OptimizerShard>> shards, ProcessGroup& group,
                                  std::unordered_set<const void*>& pending);

}  // namespace fulgur::distributed
