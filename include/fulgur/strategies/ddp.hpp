#pragma once
// DDPStrategy — Lightning's "ddp": one process per device, replicas kept identical by averaging
// gradients over c10d. Gloo carries CPU tensors, NCCL CUDA tensors:
//   DDPStrategy                       = BasicDDPStrategy<backend::Auto>  (Gloo on CPU, NCCL on CUDA)
//   BasicDDPStrategy<backend::Gloo>   / BasicDDPStrategy<backend::NCCL>  to choose.
// Processes come from torchrun, SLURM (distributed/environment.hpp) or, with devices > 1 and
// neither, from fulgur's own launcher (distributed/launcher.hpp). Parameters and buffers are
// broadcast from rank 0 at setup; gradients are all-reduced in buckets while backward runs
// (distributed/reducer.hpp). Every collective has a timeout (DDPOptions::timeout).
// It inherits strategy_defaults and writes only what differs from one process on one device.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/distributed/environment.hpp"
#include "fulgur/distributed/launcher.hpp"
#include "fulgur/distributed/no_sync.hpp"
#include "fulgur/distributed/process_group.hpp"
#include "fulgur/distributed/reducer.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/parallel_devices.hpp"
#include "fulgur/strategies/defaults.hpp"

namespace fulgur {

namespace backend {
struct Auto {};  ///< Gloo for CPU devices, NCCL for CUDA devices
struct Gloo {};  ///< CPU tensors
struct NCCL {};  ///< CUDA tensors only
}  // namespace backend

/// DDPStrategy's options (Lightning: DDPStrategy(find_unused_parameters=..., timeout=...)),
/// given to the Trainer next to its config: Trainer<A, DDPStrategy, P> trainer(config, {.timeout = ...}).
struct DDPOptions {
  bool find_unused_parameters = false;  ///< off: a parameter without gradient is an error naming it
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< the first gradient bucket, sent early
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< every collective and the rendezvous
};

/// Derived: a strategy that derives from this one and overrides a member the defaults call
/// themselves (setup_module, barrier, ...) names itself here, as with strategy_defaults<Derived>:
///   struct MyDDP : fulgur::BasicDDPStrategy<fulgur::backend::Auto, MyDDP> { void setup_module(...); };
template <class Backend, class Derived = void>
class BasicDDPStrategy
    : public strategy_defaults<std::conditional_t<std::is_void_v<Derived>, BasicDDPStrategy<Backend, void>, Derived>> {
  static_assert(std::is_same_v<Backend, backend::Auto> || std::is_same_v<Backend, backend::Gloo> ||
                    std::is_same_v<Backend, backend::NCCL>,
                "fulgur: the DDP backend must be backend::Auto, backend::Gloo or backend::NCCL.");

 public:
  static constexpr std::string_view name = "ddp";
  using options_type = DDPOptions;
  /// Compatibility rule: NCCL carries CUDA tensors only.
  static constexpr bool supports_accelerator(std::string_view accelerator) {
    return !std::is_same_v<Backend, backend::NCCL> || accelerator == "cuda";
  }

  // Not explicit: a strategy derived from this one by aggregate gets its options the same way.
  BasicDDPStrategy(DDPOptions options = {}) : options_(options) {}

  /// Finds this process's place (torchrun, SLURM, or fulgur's own launcher, started here when
  /// devices x num_nodes > 1 and no launcher is around: this process then supervises one worker per
  /// device and never returns), sets up its device and meets the other processes.
  template <class Accelerator>
  void setup_environment(Accelerator& accelerator, const ParallelDevices& parallel) {
    env_ = distributed::detect_environment();
    const int local = static_cast<int>(parallel.devices.size());
    const int expected = local * parallel.num_nodes;
    if (env_.source == distributed::ClusterEnvironment::Source::none && expected > 1)
      distributed::launch_local_workers({local, parallel.num_nodes});
    if (env_.world_size != expected)
      throw MisconfigurationError(
          "the launcher started " + std::to_string(env_.world_size) + " processes (WORLD_SIZE/SLURM_NTASKS), but the "
          "Trainer was configured for devices=" + std::to_string(local) + " x num_nodes=" +
          std::to_string(parallel.num_nodes) + " = " + std::to_string(expected) +
          "; make them agree (torchrun --nproc-per-node / #SBATCH --ntasks-per-node must equal devices).");
    if (env_.local_rank >= local)
      throw MisconfigurationError("local rank " + std::to_string(env_.local_rank) + " has no device: only " +
                                  std::to_string(local) + " were given.");
    this->set_root_device(parallel.devices[static_cast<std::size_t>(env_.local_rank)]);
    accelerator.setup_device(this->root_device());
    group_ = std::make_unique<distributed::ProcessGroup>(backend_kind(), env_, options_.timeout, this->root_device());
  }

  /// Broadcasts rank 0's parameters and buffers, then installs the gradient hooks.
  void setup_module(torch::nn::Module& module) {
    reducer_.reset();  // first: its destructor removes its hooks, which must not be the new ones
    reducer_ = std::make_unique<distributed::GradientReducer>(
        group(), broadcast_module(module),
        distributed::ReducerOptions{options_.first_bucket_bytes, options_.bucket_bytes, options_.find_unused_parameters});
  }
  /// Gives a shard-aware loader (TensorLoader) this rank's part of the data.
  template <class Loader>
  Loader&& process_dataloader(Loader&& loader) {
    if constexpr (requires { loader.shard(0, 1); }) loader.shard(global_rank(), world_size());
    return std::forward<Loader>(loader);
  }

  /// Backward with the gradient all-reduce overlapped; when it returns, every rank holds the
  /// averaged gradients (still scaled under '16-mixed', so every rank finds the same inf).
  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    precision.pre_backward(loss, module);
    if (reducer_) reducer_->prepare_for_backward();
    try {
      precision.backward(loss, module);
    } catch (...) {
      if (reducer_) reducer_->abandon_backward();  // buckets already sent must not land later
      throw;
    }
    if (reducer_) reducer_->finalize_backward();
    precision.post_backward(loss, module);
  }
  /// While alive, backward accumulates gradients locally (no communication).
  using NoSyncGuard = distributed::NoSyncGuard<distributed::GradientReducer>;
  NoSyncGuard no_backward_sync(torch::nn::Module&, bool enabled = true) {
    return NoSyncGuard(enabled ? reducer_.get() : nullptr);
  }

  /// In place; also returned. mean of integer tensors truncates.
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::mean) {
    group().all_reduce(tensor, op);
    return tensor;
  }
  /// Shape (world_size, ...). Ranks may hold different first dimensions: padded, gathered, trimmed
  /// (then use all_gather_uneven, which returns one tensor per rank).
  at::Tensor all_gather(const at::Tensor& tensor) {
    const auto parts = all_gather_uneven(tensor);
    for (const auto& part : parts)
      if (part.sizes() != tensor.sizes())
        throw MisconfigurationError("all_gather: ranks hold tensors of different shapes; use all_gather_uneven, which "
                                    "returns one tensor per rank.");
    return at::stack(parts);
  }
  std::vector<at::Tensor> all_gather_uneven(const at::Tensor& tensor) {
    if (tensor.dim() == 0) {  // a scalar: gather it as a 1-element vector
      auto parts = all_gather_uneven(tensor.unsqueeze(0));
      for (auto& part : parts) part = part.squeeze(0);
      return parts;
    }
    const auto local = tensor.contiguous();
    const auto dims = at::tensor(local.sizes().vec(), at::TensorOptions().dtype(at::kLong)).to(this->root_device());
    const auto all_dims = group().all_gather(dims);  // every rank's shape (same rank count of dims required)
    std::vector<std::int64_t> max_shape = local.sizes().vec();
    for (const auto& d : all_dims)
      for (std::size_t i = 0; i < max_shape.size(); ++i)
        max_shape[i] = std::max(max_shape[i], d[static_cast<std::int64_t>(i)].template item<std::int64_t>());
    at::Tensor padded = at::zeros(max_shape, local.options());
    std::vector<at::indexing::TensorIndex> region;
    for (auto s : local.sizes()) region.emplace_back(at::indexing::Slice(0, s));
    padded.index_put_(region, local);
    auto gathered = group().all_gather(padded);
    for (std::size_t r = 0; r < gathered.size(); ++r) {
      std::vector<at::indexing::TensorIndex> own;
      for (std::int64_t i = 0; i < all_dims[r].size(0); ++i)
        own.emplace_back(at::indexing::Slice(0, all_dims[r][i].template item<std::int64_t>()));
      gathered[r] = gathered[r].index(own);
    }
    return gathered;
  }
  at::Tensor broadcast(const at::Tensor& tensor, int src = 0) {
    group().broadcast(tensor, src);
    return tensor;
  }
  /// A string from src to every rank.
  std::string broadcast(const std::string& text, int src = 0) {
    auto size = at::scalar_tensor(static_cast<std::int64_t>(text.size()), at::kLong).to(this->root_device());
    group().broadcast(size, src);
    auto bytes = at::empty({size.template item<std::int64_t>()}, at::TensorOptions().dtype(at::kByte));
    if (global_rank() == src) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    auto on_device = bytes.to(this->root_device());
    group().broadcast(on_device, src);
    bytes = on_device.cpu();
    return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  }
  /// Any serialisable state (a StateDict of tensors, numbers, strings, nested dicts), pickled.
  StateDict broadcast(const StateDict& state, int src = 0) {
    const std::vector<char> bytes = global_rank() == src ? checkpoint::to_bytes(state) : std::vector<char>();
    const std::string received = broadcast(std::string(bytes.begin(), bytes.end()), src);
    return checkpoint::from_bytes(std::vector<char>(received.begin(), received.end()), "a broadcast value");
  }
  void barrier(std::string_view /*name*/ = {}) { group().barrier(); }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    auto votes = at::scalar_tensor(decision ? 1 : 0, at::kLong).to(this->root_device());
    group().all_reduce(votes, ReduceOp::sum);
    const auto yes = votes.template item<std::int64_t>();
    return all ? yes == world_size() : yes > 0;
  }

  int global_rank() const { return env_.rank; }
  int local_rank() const { return env_.local_rank; }
  int node_rank() const { return env_.node_rank; }
  int world_size() const { return env_.world_size; }
  const distributed::GradientReducer* reducer() const { return reducer_.get(); }
  void teardown() {
    reducer_.reset();
    group_.reset();
  }

 protected:
  distributed::ProcessGroup& group() {
    if (!group_) throw MisconfigurationError("DDPStrategy: the process group is not set up yet (setup_environment).");
    return *group_;
  }
  const DDPOptions& options() const { return options_; }
  /// Rank 0's parameters and buffers to every rank; returns the parameters by name, each once
  /// (tied weights: one tensor registered under two names counts once).
  std::vector<std::pair<std::string, at::Tensor>> broadcast_module(torch::nn::Module& module) {
    at::NoGradGuard no_grad;
    std::vector<std::pair<std::string, at::Tensor>> named;
    std::vector<const void*> seen;
    for (const auto& item : module.named_parameters()) {
      const void* impl = item.value().unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
      if (!item.value().is_meta()) group().broadcast(item.value().detach(), 0);  // meta: when materialised
      named.emplace_back(item.key(), item.value());
    }
    for (const auto& item : module.named_buffers())
      if (!item.value().is_meta()) group().broadcast(item.value(), 0);
    return named;
  }

 private:
  distributed::BackendKind backend_kind() const {
    if constexpr (std::is_same_v<Backend, backend::NCCL>)
      return distributed::BackendKind::nccl;
    else if constexpr (std::is_same_v<Backend, backend::Gloo>)
      return distributed::BackendKind::gloo;
    else
      return this->root_device().is_cuda() ? distributed::BackendKind::nccl : distributed::BackendKind::gloo;
  }

  DDPOptions options_;
  distributed::ClusterEnvironment env_;
  std::unique_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::GradientReducer> reducer_;
};

using DDPStrategy = BasicDDPStrategy<backend::Auto>;

}  // namespace fulgur
