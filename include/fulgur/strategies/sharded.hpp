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
//   Stage 3 (parameters sharded too, "fsdp") is not there yet.
// Processes, devices, options (DDPOptions) and every collective are DDPStrategy's.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/distributed/no_sync.hpp"
#include "fulgur/distributed/optimizer_shard.hpp"
#include "fulgur/distributed/shard_state.hpp"
#include "fulgur/distributed/sharded_reducer.hpp"
#include "fulgur/precision/grad_scaler.hpp"
#include "fulgur/strategies/clipping.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/ddp.hpp"

namespace fulgur {

template <int Stage, class Backend = backend::Auto>
class ShardedStrategy : public BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>> {
  using Base = BasicDDPStrategy<Backend, ShardedStrategy<Stage, Backend>>;

 public:
  static constexpr std::string_view name = Stage == 1 ? "deepspeed_stage_1" : "deepspeed_stage_2";
  // Not explicit, as DDPStrategy's. The stage is checked here rather than in the class body, so
  // that asking for another one is this one error (the class stays a well-formed type).
  ShardedStrategy(DDPOptions options = {}) : Base(options) {
    static_assert(Stage == 1 || Stage == 2,
                  "fulgur: ShardedStrategy<3> (parameters sharded too) is not implemented yet; use "
                  "ShardedStrategy<1> (optimizer state sharded), ShardedStrategy<2> (and gradients) or DDPStrategy.");
  }

  /// A module set up again starts afresh: its optimizers are set up after it.
  void setup_module(torch::nn::Module& module) {
    reducer_.reset();  // first: its destructor removes its hooks
    shards_.clear();
    if constexpr (Stage == 1) {
      Base::setup_module(module);
    } else {
      named_parameters_ = this->broadcast_module(module);
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
    shards_.push_back(std::make_unique<distributed::OptimizerShard>(
        this->group(), optimizer, distributed::ShardLayout{o.first_bucket_bytes, o.bucket_bytes}));
  }

  /// Stage 2: backward with each bucket's gradients reduce-scattered into the shards as soon as
  /// they are ready; the module's parameters keep no gradient.
  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    if constexpr (Stage == 1) {
      Base::backward(loss, module, precision);
    } else {
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
    requires(Stage == 2)
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
    if (stepped) shard.gather_parameters();
    if constexpr (Stage == 2)
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
    out.insert("bucket_bytes", static_cast<std::int64_t>(this->options().bucket_bytes));
    out.insert("first_bucket_bytes", static_cast<std::int64_t>(this->options().first_bucket_bytes));
    out.insert("shard", mine.at("archive"));
    return out;
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
    c10::impl::GenericList mine(c10::TensorType::get());
    c10::impl::GenericList files(c10::StringType::get());
    for (int r = 0; r < this->world_size(); ++r) files.push_back(shards_folder + "/rank" + std::to_string(r) + ".pt");
    c10::IValue manifest = manifest_of(state.to_ivalue(), mine, files);
    if (!mine.empty()) {
      detail::make_directories(folder + "/" + shards_folder);
      StateDict part;
      part.insert("format", std::string("fulgur-optimizer-shards"));
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
    const DDPOptions& o = this->options();
    const distributed::ShardLayout layout{o.first_bucket_bytes, o.bucket_bytes};
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
    for (const auto& [key, size] : {std::pair{"bucket_bytes", o.bucket_bytes}, std::pair{"first_bucket_bytes", o.first_bucket_bytes}}) {
      const auto mine = static_cast<std::int64_t>(size);
      if (!state.contains(key) || state.at(key).toInt() != mine)
        throw CheckpointError(std::string("fulgur: ShardedStrategy: the optimizer state was sharded with DDPOptions::") +
                              key + " = " + (state.contains(key) ? std::to_string(state.at(key).toInt()) : "?") +
                              ", this run has " + std::to_string(mine) + "; resume with the same bucket sizes.");
    }
    if (state.at("world_size").toInt() != this->world_size()) {  // another world size: resharded
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

  void teardown() {
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
  /// `value` with each sharded optimizer state's "shard" moved into `mine` and replaced by the
  /// files of every rank and its slot in them.
  static c10::IValue manifest_of(const c10::IValue& value, c10::impl::GenericList& mine,
                                 const c10::impl::GenericList& files) {
    if (value.isGenericDict()) {
      const auto dict = value.toGenericDict();
      const auto format = dict.find(c10::IValue("format"));
      const bool sharded = format != dict.end() && format->value().isString() &&
                           format->value().toStringRef() == distributed::sharded_optimizer_format &&
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

  distributed::ShardedGradientReducer& sharded_reducer() {
    if (!reducer_) {
      if (shards_.empty())
        throw MisconfigurationError("fulgur: ShardedStrategy<2>: backward before any optimizer was set up; the "
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
  std::vector<std::pair<std::string, at::Tensor>> named_parameters_;  // stage 2: the module's, for errors
  std::unique_ptr<distributed::ShardedGradientReducer> reducer_;
};

}  // namespace fulgur
