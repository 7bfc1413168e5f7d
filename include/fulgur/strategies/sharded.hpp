#pragma once
// ShardedStrategy<Stage> — ZeRO-style sharded data parallelism (Lightning's "deepspeed_stage_N").
//   ShardedStrategy<1> ("deepspeed_stage_1"): DDP whose ranks each keep the optimizer state of 1/N
//   of the parameters. Gradients are averaged while backward runs, as under DDPStrategy; the
//   optimizer then steps this rank's shard of the flat parameters and the shards are all-gathered
//   (distributed/optimizer_shard.hpp). Unscaling, clipping, zero_grad and toggle_optimizer see the
//   module's whole gradients, as under DDP, so stage 1 trains as DDP does, bit for bit, with any
//   element-wise torch::optim optimizer (SGD, Adam, AdamW, Adagrad, RMSprop).
//   ShardedStrategy<2> ("deepspeed_stage_2"): the gradients are sharded too. Backward
//   reduce-scatters them bucket by bucket and frees the module's (distributed/sharded_reducer.hpp),
//   so a rank holds 1/N of them; the loss scaler's inf check and the clipping norm are reduced
//   across the ranks. The module's parameters have no .grad after backward.
//   ShardedStrategy<3> ("fsdp"): the parameters are sharded too. Each unit a WrapPolicy picks
//   (distributed/wrap_policy.hpp: submodules by type or by size, as FSDP's auto-wrap) is a bucket
//   of its own storage, freed at rest; a rank keeps 1/N of the weights, gradients and optimizer
//   state. A unit is gathered when an op first reads one of its parameters, forward or backward
//   (distributed/parameter_gatherer.hpp), and released when the next unit is gathered; gradients
//   go as stage 2's. The module's state_dict is gathered whole for a checkpoint; the module is whole
//   again after fit.
// Processes, devices, options (DDPOptions; stage 3: FSDPOptions) and every collective are DDPStrategy's.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/distributed/no_sync.hpp"
#include "fulgur/distributed/optimizer_shard.hpp"
#include "fulgur/distributed/parameter_gatherer.hpp"
#include "fulgur/distributed/meta_init.hpp"
#include "fulgur/distributed/shard_state.hpp"
#include "fulgur/distributed/sharded_module_state.hpp"
#include "fulgur/distributed/sharded_reducer.hpp"
#include "fulgur/distributed/wrap_policy.hpp"
#include "fulgur/precision/grad_scaler.hpp"
#include "fulgur/strategies/clipping.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/ddp.hpp"

namespace fulgur {

using distributed::WrapPolicy;

/// ShardedStrategy<3>'s options: its buckets are the wrapped units, so it has no bucket sizes.
/// How stage 3 puts the module's weights in a checkpoint (Lightning's FSDPStrategy state_dict_type).
enum class StateDictType {
  sharded,  ///< each rank writes the chunks it keeps, in parallel, nothing gathered (the default)
  full,     ///< whole tensors in the manifest, gathered a unit at a time (each rank holds them in host memory)
};

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
  operator DDPOptions() const {
    DDPOptions o;
    o.find_unused_parameters = find_unused_parameters;
    o.timeout = timeout;
    return o;
  }
};

template <int Stage, class Backend = backend::Auto>
class ShardedStrategy : public BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>> {
  using Base = BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>>;

 public:
  static constexpr std::string_view name = Stage == 1   ? "deepspeed_stage_1"
                                           : Stage == 2 ? "deepspeed_stage_2"
                                                        : "fsdp";
  using options_type = std::conditional_t<Stage == 3, FSDPOptions, DDPOptions>;
  // Not explicit, as DDPStrategy's. The stage is checked here rather than in the class body, so
  // that asking for another one is this one error (the class stays a well-formed type).
  ShardedStrategy(options_type options = {}) : Base(static_cast<DDPOptions>(options)) {
    static_assert(Stage >= 1 && Stage <= 3,
                  "fulgur: ShardedStrategy<Stage>: the stages are 1 (optimizer state sharded), 2 (and gradients) "
                  "and 3 (and parameters).");
    if constexpr (Stage == 3) {
      auto_wrap_ = options.auto_wrap;
      param_init_ = options.param_init;
      state_dict_type_ = options.state_dict_type;
    }
  }

  /// Stage 3 with empty_init: modules created in this context are on the meta device (shapes, no
  /// memory), and set-up gives them memory a unit at a time, already sharded (meta_init.hpp) — a
  /// model too big for one rank. Otherwise, and for stages 1 and 2, DDP's context (the root device).
  template <class Precision>
  auto module_init_context(Precision& precision, bool empty_init) {
    const c10::Device device = this->root_device();
    const bool meta = Stage == 3 && empty_init;
    return InitContext<decltype(precision.module_init_context())>{
        c10::OptionalDeviceGuard(device), DefaultDeviceGuard(meta ? c10::Device(c10::kMeta) : device),
        precision.module_init_context()};
  }
  /// Stage 3: tensors on the meta device stay there until setup_optimizer materialises them.
  void module_to_device(torch::nn::Module& module) {
    if constexpr (Stage == 3) {
      if (!distributed::first_meta_tensor(module).empty()) {
        at::NoGradGuard no_grad;
        const c10::Device device = this->root_device();
        for (auto& t : module.parameters())
          if (t.defined() && !t.is_meta() && t.device() != device) t.set_data(t.to(device));
        for (auto& t : module.buffers())
          if (t.defined() && !t.is_meta() && t.device() != device) t.set_data(t.to(device));
        return;
      }
    }
    Base::module_to_device(module);
  }

  /// A module set up again starts afresh: its optimizers are set up after it.
  void setup_module(torch::nn::Module& module) {
    if (gatherer_) gatherer_->gather_all();  // stage 3, set up again: the weights whole before they are laid out anew
    gatherer_.reset();  // first: their destructors remove their callback and hooks
    reducer_.reset();
    shards_.clear();
    if constexpr (Stage == 1) {
      Base::setup_module(module);
    } else {
      named_parameters_ = this->broadcast_module(module);  // meta tensors: broadcast when materialised
      if constexpr (Stage == 3) {
        units_ = distributed::wrap_units(module, auto_wrap_);
        module_ = &module;
        meta_pending_ = distributed::meta_tensors(module);
      }
    }
  }
  /// Lays the optimizer's parameters out in shards (it must hold no state yet).
  void setup_optimizer(torch::optim::Optimizer& optimizer) {
    if (find_shard(optimizer) != nullptr)
      throw MisconfigurationError("fulgur: ShardedStrategy: this optimizer is set up already.");
    for (const auto& shard : shards_)
      for (const auto* bucket : shard->buckets())
        for (const auto& slot : bucket->slots)
          for (const auto& group : optimizer.param_groups())
            for (const auto& p : group.params())
              if (p.unsafeGetTensorImpl() == slot.param.unsafeGetTensorImpl())
                throw MisconfigurationError("fulgur: ShardedStrategy: a parameter of this optimizer is in another "
                                            "optimizer too; each parameter may belong to one optimizer only.");
    reducer_.reset();  // stage 2: laid out again over every optimizer at the next backward
    const DDPOptions& o = this->options();
    distributed::ShardLayout layout{o.first_bucket_bytes, o.bucket_bytes};
    if constexpr (Stage == 3) {  // a bucket per wrapped unit (per param group, dtype and device)
      layout.bucket_params = distributed::ShardPlan::of(optimizer, this->world_size(), layout, [this](const at::Tensor& p) {
                               return units_.of(p.unsafeGetTensorImpl());
                             }).bucket_params();
    }
    // made first: if it refuses the optimizer, the shards and gatherer set up so far are untouched
    auto made = std::make_unique<distributed::OptimizerShard>(
        this->group(), optimizer, layout, /*shard_parameters=*/Stage == 3,
        Stage == 3 ? std::optional<c10::Device>(this->root_device()) : std::nullopt);
    if constexpr (Stage == 3) gatherer_.reset();
    shards_.push_back(std::move(made));
    if constexpr (Stage == 3) {
      materialize();  // a meta-built model: every tensor given memory (this optimizer's sharded) and a value
      rebuild_gatherer();
    }
  }

  /// Stage 3: a meta-built module set up without an optimizer gets whole memory here.
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    Base::setup_module_and_optimizers(module, optimizers);
    if constexpr (Stage == 3)
      if (!meta_pending_.empty()) {
        gatherer_.reset();  // its observer must not see the initialisation's ops; made again below
        materialize();
        if (!shards_.empty()) rebuild_gatherer();
      }
  }

  /// Stage 2: backward with each bucket's gradients reduce-scattered into the shards as soon as
  /// they are ready; the module's parameters keep no gradient.
  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    if constexpr (Stage == 1) {
      Base::backward(loss, module, precision);
    } else {
      if constexpr (Stage == 3)
        if (gatherer_) gatherer_->rethrow_failure();  // a gather in forward failed: the loss is not real
      precision.pre_backward(loss, module);
      auto& reducer = sharded_reducer();
      reducer.prepare_for_backward();
      try {
        precision.backward(loss, module);
      } catch (...) {
        reducer.abandon_backward();  // buckets already sent must not land later
        throw;
      }
      reducer.finalize_backward();
      if constexpr (Stage == 3) {
        gatherer_->release_all();  // the root unit and the last one used
        gatherer_->rethrow_failure();
      }
      precision.post_backward(loss, module);
    }
  }
  /// While alive, backward accumulates on the parameters without communicating.
  auto no_backward_sync(torch::nn::Module& module, bool enabled = true) {
    if constexpr (Stage == 1) return Base::no_backward_sync(module, enabled);
    else return distributed::NoSyncGuard<distributed::ShardedGradientReducer>(enabled ? &sharded_reducer() : nullptr);
  }

  /// Stage 2: each rank unscales its shard of the gradients; the inf/NaN flags are then summed
  /// over the ranks, so that all skip alike. (Stage 1 unscales the whole gradients, as DDP.)
  template <class Precision>
    requires(Stage >= 2)
  void unscale_gradients(torch::optim::Optimizer& optimizer, Precision& precision) {
    if constexpr (detail::uses_scaler<Precision>()) {
      auto& scaler = precision.scaler();
      if (!scaler.is_enabled() || scaler.stage(optimizer) != GradScaler::Stage::ready) return;
      {
        auto view = shard_of(optimizer).with_shards();
        precision.unscale_gradients(optimizer);
      }
      scaler.for_each_found_inf(optimizer, [this](const at::Tensor& flag) { this->group().all_reduce(flag, ReduceOp::sum); });
    }
  }
  /// Stage 2: the norm of the whole gradients, from every rank's shard (sum of |g|^p, or the max,
  /// all-reduced), then each rank scales its shard. Stage 1: DDP's.
  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    if constexpr (Stage == 1) {
      return Base::clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite, precision);
    } else {
      unscale_gradients(optimizer, precision);
      const auto& grads = shard_of(optimizer).shard_grads();
      if (grads.empty()) return at::zeros({});
      return clip_sharded_grad_norm(grads, max_norm, norm_type, error_if_nonfinite && !detail::uses_scaler<Precision>(),
                                    [this](const at::Tensor& t, ReduceOp op) { this->group().all_reduce(t, op); });
    }
  }
  template <class Precision>
  void clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    if constexpr (Stage == 1) {
      Base::clip_gradients_value(module, optimizer, clip_value, precision);
    } else {
      unscale_gradients(optimizer, precision);
      auto view = shard_of(optimizer).with_shards();
      clip_grad_value(precision.main_params(optimizer), clip_value);  // element-wise: the shard's own
    }
  }

  /// Steps this rank's shard (stage 1 copies it out of the whole averaged gradients, which the loss
  /// scaler has checked alike on every rank; stage 2 has it from the reduce-scatter and sums the
  /// ranks' inf flags), then gathers every rank's.
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    if constexpr (Stage == 3)
      if (gatherer_) gatherer_->rethrow_failure();  // nothing is stepped after a failed gather
    distributed::OptimizerShard& shard = shard_of(optimizer);
    if constexpr (Stage == 1) {
      precision.unscale_gradients(optimizer);
      shard.copy_gradients();
    } else {
      unscale_gradients(optimizer, precision);
    }
    bool stepped = false;
    {
      auto view = shard.with_shards();
      stepped = precision.optimizer_step(optimizer);
    }
    if constexpr (Stage == 3) {
      gatherer_->release_all();  // whole copies of the old weights: gathered anew on use
      if (stepped) shard.bump_versions();
    } else if (stepped) {
      shard.gather_parameters();
    }
    if constexpr (Stage >= 2)
      if (reducer_) reducer_->gradients_consumed(shard);
    return stepped;
  }

  /// This rank's shard of the optimizer state (LibTorch's archive of its optimizer over the shard),
  /// with the layout: {"format": "fulgur-sharded-optimizer", "world_size", "bucket_bytes",
  /// "first_bucket_bytes", "shard"}. Nothing is gathered: save_checkpoint writes each rank's.
  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) {
    const StateDict mine = [&] {
      auto view = shard_of(optimizer).with_shards();
      return checkpoint::optimizer_state_dict(optimizer);
    }();
    StateDict out;
    out.insert("format", std::string(distributed::sharded_optimizer_format));
    out.insert("world_size", static_cast<std::int64_t>(this->world_size()));
    const distributed::ShardLayout& layout = shard_of(optimizer).layout();
    if (layout.bucket_params.empty()) {
      out.insert("bucket_bytes", static_cast<std::int64_t>(layout.bucket_bytes));
      out.insert("first_bucket_bytes", static_cast<std::int64_t>(layout.first_bucket_bytes));
    } else {
      out.insert("bucket_params", c10::List<std::int64_t>(layout.bucket_params));
    }
    out.insert("shard", mine.at("archive"));
    return out;
  }

  /// Stage 3: the module whole again at the end of fit (every unit gathered; they are released at
  /// the next step, if another fit or a manual step follows).
  void on_train_end() {
    if constexpr (Stage == 3)
      if (gatherer_) gatherer_->gather_all();
  }

  /// The module's state_dict. Stage 3, sharded (the default): this rank's chunks of the weights
  /// and where each weight lies (distributed/sharded_module_state.hpp) — nothing gathered, each
  /// rank's chunks go to its own file when saved. Stage 3, full: copied to the CPU tensor by tensor,
  /// each unit gathered as its copy reads it and released when the next one is (a unit at a time on
  /// the device), then what is left released (unless every unit was whole: after fit).
  StateDict get_module_state_dict(const torch::nn::Module& module) {
    if constexpr (Stage == 3) {
      if (gatherer_) {
        gatherer_->rethrow_failure();
        if (state_dict_type_ == StateDictType::sharded) {
          for (auto& shard : shards_) shard->keep_writes();  // a weight written in place while whole
          return distributed::sharded_module_state(module, shards_, this->world_size());
        }
        const bool whole = gatherer_->all_gathered();
        StateDict out;
        {
          at::NoGradGuard no_grad;
          for (const auto& [key, t] : distributed::state_tensors(module))  // one op per tensor: each unit gathered once
            out.insert(key, t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).detach());
        }
        gatherer_->rethrow_failure();
        if (!whole) gatherer_->release_all();
        return out;
      }
    }
    return checkpoint::module_state_dict(module);
  }
  /// Stage 3: a sharded state laid out as this run's loads each rank's chunks straight into its
  /// shards (its own file only, nothing gathered); any other state — whole, or sharded on another
  /// world size or other units (joined first) — is loaded into the gathered module, each rank's
  /// chunk then copied into its shards. Other stages and strategies join a sharded state whole.
  void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    if constexpr (Stage == 3) {
      if (gatherer_) {
        gatherer_->rethrow_failure();
        const bool sharded = distributed::is_sharded_module_state(state);
        if (sharded) {
          gatherer_->release_all();
          if (distributed::same_module_layout(
                  state, distributed::sharded_module_state(module, shards_, this->world_size(), /*with_shard=*/false))) {
            load_own_chunks(module, state);
            return;
          }
        }
        const StateDict whole = sharded ? distributed::consolidate_module_state(state) : state;
        gatherer_->gather_all();
        checkpoint::load_module_state_dict(module, whole, strict);
        for (auto& shard : shards_) shard->scatter_parameters();  // each rank's chunk into its shards
        gatherer_->release_all();
        return;
      }
    }
    checkpoint::load_module_state_dict(module, state, strict);
  }

  /// A sharded checkpoint: every rank writes its optimizer shards to `<path>.shards/<id>/rank<r>.pt`
  /// (in parallel, each atomically), then global rank 0 writes `path` — the manifest: the
  /// checkpoint with each sharded optimizer state naming its files — and removes the shard files of
  /// the checkpoint it replaced. A crash at any point leaves the previous manifest and its files
  /// whole. (Every rank must see the same folder: a shared file system across nodes.)
  void save_checkpoint(const std::string& path, const StateDict& state) {
    const std::string id = this->broadcast(this->global_rank() == 0 ? checkpoint_id() : std::string(), 0);
    const std::string name = path.substr(path.find_last_of('/') + 1), folder = detail::parent_folder(path);
    const std::string shards_folder = name + ".shards/" + id;
    c10::impl::GenericList mine(c10::AnyType::get());
    c10::impl::GenericList files(c10::StringType::get());
    for (int r = 0; r < this->world_size(); ++r) files.push_back(shards_folder + "/rank" + std::to_string(r) + ".pt");
    c10::IValue manifest = manifest_of(state.to_ivalue(), mine, files);
    if (!mine.empty()) {
      detail::make_directories(folder + "/" + shards_folder);
      StateDict part;
      part.insert("format", std::string(distributed::rank_file_format));
      part.insert("rank", static_cast<std::int64_t>(this->global_rank()));
      part.insert("world_size", static_cast<std::int64_t>(this->world_size()));
      part.insert("shards", mine);
      checkpoint::save(folder + "/" + files.get(static_cast<std::size_t>(this->global_rank())).toStringRef(), part);
    }
    this->barrier("save_checkpoint shards");
    if (this->is_global_zero()) {
      checkpoint::save(path, StateDict(manifest.toGenericDict()));
      for (const auto& other : detail::subdirectories(folder + "/" + name + ".shards"))
        if (other != id) detail::remove_tree(folder + "/" + name + ".shards/" + other);
    }
    this->barrier("save_checkpoint");
  }

  /// This rank's shard of a state from get_optimizer_state: written by as many ranks, or by another
  /// number (resharded), or an unsharded state (a run on one device or under DDP: sharded here).
  void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
    distributed::OptimizerShard& shard = shard_of(optimizer);
    const distributed::ShardLayout& layout = shard.layout();
    const bool sharded = state.contains("format") && state.at("format").isString() &&
                         state.at("format").toStringRef() == distributed::sharded_optimizer_format;
    if (!sharded) {  // the whole state: loaded as it was written, then cut into this rank's shards
      checkpoint::load_optimizer_state_dict(optimizer, state);
      detail::check_optimizer_state_shapes(optimizer);
      distributed::ShardedOptimizerState::from_whole(optimizer, layout)
          .load_shards(optimizer, shard.shards(), this->world_size(), this->global_rank());
      auto view = shard.with_shards();
      detail::check_optimizer_state_shapes(optimizer);
      return;
    }
    const distributed::ShardLayout saved = distributed::sharded_layout(state);
    if (!same_layout(saved, layout)) {  // other buckets (sizes, or stage 3's units): through the whole state
      {
        distributed::ShardedOptimizerState(optimizer, distributed::sharded_archives(state), saved).load_whole(optimizer);
      }
      detail::check_optimizer_state_shapes(optimizer);
      distributed::ShardedOptimizerState::from_whole(optimizer, layout)
          .load_shards(optimizer, shard.shards(), this->world_size(), this->global_rank());
    } else if (state.at("world_size").toInt() != this->world_size()) {  // another world size: resharded
      distributed::ShardedOptimizerState(optimizer, distributed::sharded_archives(state), layout)
          .load_shards(optimizer, shard.shards(), this->world_size(), this->global_rank());
    } else {  // this rank's file only
      StateDict mine;
      mine.insert("format", std::string("libtorch-optimizer-archive"));
      mine.insert("archive", distributed::sharded_archives(state, this->global_rank())
                                 .at(static_cast<std::size_t>(this->global_rank())));
      auto view = shard.with_shards();
      checkpoint::load_optimizer_state_dict(optimizer, mine);
    }
    auto view = shard.with_shards();
    detail::check_optimizer_state_shapes(optimizer);
  }

  /// What the optimizers hold, per rank: elements of the shards they step, and of the whole.
  const std::vector<std::unique_ptr<distributed::OptimizerShard>>& optimizer_shards() const { return shards_; }

  /// Stage 2's reducer (built at the first backward after the optimizers are set up), or null.
  const distributed::ShardedGradientReducer* sharded_gradient_reducer() const { return reducer_.get(); }

  /// Stage 3's gatherer (made when an optimizer is set up), or null: its statistics.
  const distributed::ParameterGatherer* parameter_gatherer() const { return gatherer_.get(); }
  /// Stage 3: the submodules the wrap policy made units of.
  const std::vector<std::string>& wrapped_units() const { return units_.names; }
  /// Stage 3, a meta-built model: what its materialisation took (modules, most bytes whole at once).
  const distributed::MaterializeStats& materialize_stats() const { return materialized_; }

  /// No collective here (a peer may be gone, or still inside a step): after a normal fit stage 3's
  /// module is whole already (on_train_end); after a failed one its weights stay sharded.
  void teardown() {
    if constexpr (Stage == 3) gatherer_.reset();
    reducer_.reset();
    shards_.clear();
    Base::teardown();
  }

 private:
  /// Names a save: rank 0's clock and process, unique per checkpoint path in practice.
  static std::string checkpoint_id() {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now).count()) + "-" +
           std::to_string(::getpid());
  }
  /// Stage 3: this rank's chunks (its file, or the state in memory) into its shards, the whole
  /// tensors into the module; the layouts were compared first.
  void load_own_chunks(torch::nn::Module& module, const StateDict& state) {
    const std::vector<at::Tensor> chunks = distributed::sharded_module_chunks(state, this->global_rank(), /*own_rank=*/true);
    at::NoGradGuard no_grad;
    std::size_t i = 0;
    for (auto& shard : shards_)
      for (auto* bucket : shard->buckets()) {
        if (i >= chunks.size() || chunks[i].numel() != bucket->shard.numel())
          throw CheckpointError("fulgur: ShardedStrategy: rank " + std::to_string(this->global_rank()) + "'s weights "
                                "file does not hold the chunks its manifest describes (bucket " + std::to_string(i) +
                                "); the .shards folder is not the one this checkpoint wrote.");
        bucket->shard.copy_(chunks[i++].reshape(bucket->shard.sizes()));
      }
    std::unordered_map<std::string, at::Tensor> tensors;
    for (const auto& item : module.named_parameters()) tensors.emplace(item.key(), item.value());
    for (const auto& item : module.named_buffers()) tensors.emplace(item.key(), item.value());
    for (const auto& item : state.at("whole").toGenericDict()) {
      const std::string& key = item.key().toStringRef();
      const at::Tensor value = item.value().toTensor();
      const auto found = tensors.find(key);
      if (found == tensors.end() || found->second.sizes() != value.sizes())
        throw CheckpointError("fulgur: the state_dict does not fit the module: '" + key + "' " +
                              (found == tensors.end() ? std::string("is not the module's")
                                                      : "has shape " + c10::str(value.sizes()) + ", the module's " +
                                                            c10::str(found->second.sizes())) + ".");
      found->second.copy_(value);
    }
    for (auto& shard : shards_) shard->bump_versions();  // a graph saved before the load is refused
  }

  /// `value` with each sharded optimizer state's "shard" moved into `mine` and replaced by the
  /// files of every rank and its slot in them.
  static c10::IValue manifest_of(const c10::IValue& value, c10::impl::GenericList& mine,
                                 const c10::impl::GenericList& files) {
    if (value.isGenericDict()) {
      const auto dict = value.toGenericDict();
      const auto format = dict.find(c10::IValue("format"));
      const bool sharded = format != dict.end() && format->value().isString() &&
                           (format->value().toStringRef() == distributed::sharded_optimizer_format ||
                            format->value().toStringRef() == distributed::sharded_module_format) &&
                           dict.contains(c10::IValue("shard"));
      c10::impl::GenericDict out(dict.keyType(), dict.valueType());
      for (const auto& item : dict) {
        if (sharded && item.key().toStringRef() == "shard") continue;
        out.insert(item.key(), manifest_of(item.value(), mine, files));
      }
      if (sharded) {
        out.insert_or_assign(c10::IValue("files"), files.copy());
        out.insert_or_assign(c10::IValue("slot"), static_cast<std::int64_t>(mine.size()));
        mine.push_back(dict.at(c10::IValue("shard")));
      }
      return out;
    }
    if (value.isList()) {
      const auto list = value.toList();
      c10::impl::GenericList out(list.elementType());
      for (std::size_t i = 0; i < list.size(); ++i) out.push_back(manifest_of(list.get(i), mine, files));
      return out;
    }
    return value;
  }

  static bool same_layout(const distributed::ShardLayout& a, const distributed::ShardLayout& b) {
    if (!a.bucket_params.empty() || !b.bucket_params.empty()) return a.bucket_params == b.bucket_params;
    return a.bucket_bytes == b.bucket_bytes && a.first_bucket_bytes == b.first_bucket_bytes;
  }
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

  void rebuild_gatherer() {
    std::vector<distributed::ParameterGatherer::Entry> entries;
    for (auto& shard : shards_)
      for (auto* bucket : shard->buckets())
        entries.push_back({shard.get(), bucket, units_.of(bucket->slots.front().param.unsafeGetTensorImpl())});
    gatherer_ = std::make_unique<distributed::ParameterGatherer>(std::move(entries));
  }
  /// Stage 3: the meta tensors left given memory and a value (none: nothing to do).
  void materialize() {
    if (meta_pending_.empty() || module_ == nullptr) return;
    const auto stats = distributed::materialize_meta(*module_, this->root_device(), param_init_, shards_,
                                                     this->group(), meta_pending_);
    materialized_.modules += stats.modules;
    materialized_.whole_bytes += stats.whole_bytes;
    materialized_.peak_bytes = std::max(materialized_.peak_bytes, stats.peak_bytes);
  }

  distributed::ShardedGradientReducer& sharded_reducer() {
    if (!reducer_) {
      if (shards_.empty())
        throw MisconfigurationError("fulgur: ShardedStrategy: backward before any optimizer was set up; the "
                                    "gradients are reduced into the optimizers' shards (return them from "
                                    "configure_optimizers, or pass them to setup).");
      std::vector<distributed::OptimizerShard*> shards;
      for (auto& shard : shards_) shards.push_back(shard.get());
      reducer_ = std::make_unique<distributed::ShardedGradientReducer>(this->group(), shards, named_parameters_,
                                                                       this->options().find_unused_parameters);
    }
    return *reducer_;
  }

  std::vector<std::unique_ptr<distributed::OptimizerShard>> shards_;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters_;  // stages 2, 3: the module's, for errors
  std::unique_ptr<distributed::ShardedGradientReducer> reducer_;
  WrapPolicy auto_wrap_{};              // stage 3
  distributed::WrappedUnits units_;     // stage 3: of the module set up
  distributed::ParameterInit param_init_;                   // stage 3: for a meta-built module
  StateDictType state_dict_type_ = StateDictType::sharded;  // stage 3
  torch::nn::Module* module_ = nullptr;                     // stage 3: the module set up
  std::unordered_set<const void*> meta_pending_;            // stage 3: its tensors still on the meta device
  distributed::MaterializeStats materialized_;
  std::unique_ptr<distributed::ParameterGatherer> gatherer_;  // stage 3; declared last: destroyed first
};

}  // namespace fulgur
