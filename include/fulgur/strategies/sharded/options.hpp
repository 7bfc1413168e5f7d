#pragma once
// What a user gives ShardedStrategy besides DDPOptions: stage 3's FSDPOptions — which submodules
// are gathered as one unit (WrapPolicy), how its checkpoints hold the weights (StateDictType), and
// how a model built on the meta device is initialised (ParameterInit).
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "fulgur/detail/module_type.hpp"
#include "fulgur/distributed/data_parallel.hpp"

namespace torch::nn {
class Module;
}

namespace fulgur {
namespace distributed {

/// Which submodules ShardedStrategy<3> gathers as one unit (FSDP's auto-wrap policy). A unit's
/// parameters are whole on a rank only while its ops run; the parameters no unit holds form the
/// root unit, whole from their first use until the end of backward.
///   WrapPolicy::by_type<BlockImpl>()        every submodule of that type (a transformer block)
///   WrapPolicy::by_size(1'000'000)          every submodule holding at least that many parameter
///                                           elements not in a unit inside it (FSDP's size_based_auto_wrap_policy)
/// Both may be set; a submodule that either picks is a unit. Units are chosen innermost first.
struct WrapPolicy {
  std::int64_t min_params = 0;                   ///< 0: no unit by size
  std::vector<std::type_index> module_types{};  ///< the submodules' own types (FooImpl; a holder Foo names it too)

  template <class... Modules>
  static WrapPolicy by_type(std::int64_t min_params = 0) {
    return {min_params, {std::type_index(typeid(fulgur::detail::contained_t<Modules>))...}};
  }
  static WrapPolicy by_size(std::int64_t min_params) { return {min_params, {}}; }
};

/// Initialises one module's own parameters and buffers in place (not its children's); called for
/// each module that has any, in registration order, when ShardedStrategy<3> gives a model built on
/// the meta device its memory. Return false for a module it does not know: the set-up then stops
/// with an error that names it.
using ParameterInit = std::function<bool(torch::nn::Module&)>;

/// How LibTorch's built-in modules with parameters initialise them at construction: reset_parameters()
/// (Linear, Bilinear, Conv and ConvTranspose 1d–3d, Embedding, EmbeddingBag, LayerNorm, GroupNorm,
/// BatchNorm and InstanceNorm 1d–3d, RNN, LSTM, GRU and their cells), PReLU's constant, and
/// MultiheadAttention's out_proj then its own projections; false for any other type. The layers of
/// TransformerEncoder/Decoder and Transformer's final redraw are followed too (docs/sharding.md).
bool reset_builtin_parameters(torch::nn::Module& module);

/// Modules whose initialisation covers their children (MultiheadAttention: its out_proj): ParameterInit
/// is called for the module with every tensor of its subtree given memory, and not for the children.
bool initialises_children(const torch::nn::Module& module);

/// What materialising a meta-built model took.
struct MaterializeStats {
  std::int64_t modules = 0;     ///< modules initialised
  std::int64_t peak_bytes = 0;  ///< most bytes whole at once: open buckets plus tensors kept whole
  std::int64_t whole_bytes = 0; ///< bytes of the tensors kept whole (in no bucket)
};

}  // namespace distributed

using distributed::WrapPolicy;

/// How stage 3 puts the module's weights in a checkpoint (Lightning's FSDPStrategy state_dict_type).
enum class StateDictType {
  sharded,  ///< each rank writes the chunks it keeps, in parallel, nothing gathered (the default)
  full,     ///< whole tensors in the manifest, gathered a unit at a time (each rank holds them in host memory)
};

/// ShardedStrategy<3>'s options: its buckets are the wrapped units, so it has no bucket sizes.
struct FSDPOptions {
  WrapPolicy auto_wrap{};  ///< which submodules are gathered as one unit (none: the whole module is one)
  /// Sharded: a checkpoint's weights are per-rank files beside the manifest, as its optimizer states
  /// are; any run reads them (checkpoint::consolidate makes one self-contained file of them).
  StateDictType state_dict_type = StateDictType::sharded;
  /// A model built in init_module(/*empty_init=*/true) is on the meta device until set-up, where each
  /// module's own parameters and buffers are initialised by this, in registration order (the
  /// built-in modules' reset_parameters() by default; wrap it to add your own types).
  distributed::ParameterInit param_init = distributed::reset_builtin_parameters;
  bool find_unused_parameters = false;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< every collective and the rendezvous
  bool sync_batchnorm = false;  ///< as DDPOptions::sync_batchnorm
  operator DDPOptions() const {
    DDPOptions o;
    o.find_unused_parameters = find_unused_parameters;
    o.sync_batchnorm = sync_batchnorm;
    o.timeout = timeout;
    return o;
  }
};

}  // namespace fulgur
