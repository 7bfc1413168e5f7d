#pragma once
// DDPStrategy — Lightning's "ddp": one process per device, replicas kept identical by averaging
// gradients over c10d. Gloo carries CPU tensors, NCCL CUDA tensors:
//   DDPStrategy                       = BasicDDPStrategy<backend::Auto>  (Gloo on CPU, NCCL on CUDA)
//   BasicDDPStrategy<backend::Gloo>   / BasicDDPStrategy<backend::NCCL>  to choose.
// Processes come from torchrun, SLURM (distributed/environment.hpp) or, with devices > 1 and
// neither, from fulgur's own launcher (distributed/launcher.hpp). Parameters and buffers are
// broadcast from rank 0 at setup; gradients are all-reduced in buckets while backward runs
// (distributed/reducer.hpp). Every collective has a timeout (TrainerConfig::ddp.timeout).
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstring>
#include <algorithm>
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
#include "fulgur/distributed/process_group.hpp"
#include "fulgur/distributed/reducer.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/common.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

namespace backend {
struct Auto {};  ///< Gloo for CPU devices, NCCL for CUDA devices
struct Gloo {};  ///< CPU tensors
struct NCCL {};  ///< CUDA tensors only
}  // namespace backend

template <class Backend>
class BasicDDPStrategy {
  static_assert(std::is_same_v<Backend, backend::Auto> || std::is_same_v<Backend, backend::Gloo> ||
                    std::is_same_v<Backend, backend::NCCL>,
                "fulgur: the DDP backend must be backend::Auto, backend::Gloo or backend::NCCL.");

 public:
  static constexpr std::string_view name = "ddp";
  /// Compatibility rule: NCCL carries CUDA tensors only.
  static constexpr bool supports_accelerator(std::string_view accelerator) {
    return !std::is_same_v<Backend, backend::NCCL> || accelerator == "cuda";
  }

  /// From the accelerator's devices on this node and the Trainer's configuration.
  BasicDDPStrategy(const std::vector<c10::Device>& devices, const TrainerConfig& config)
      : options_(config.ddp), env_(distributed::detect_environment()) {
    const int expected = static_cast<int>(devices.size()) * config.num_nodes;
    // No launcher around us: this process supervises one worker per device and never returns.
    if (env_.source == distributed::ClusterEnvironment::Source::none && expected > 1)
      distributed::launch_local_workers({static_cast<int>(devices.size()), config.num_nodes});
    if (env_.world_size != expected)
      throw MisconfigurationError(
          "the launcher started " + std::to_string(env_.world_size) + " processes (WORLD_SIZE/SLURM_NTASKS), but the "
          "Trainer was configured for devices=" + std::to_string(devices.size()) + " x num_nodes=" +
          std::to_string(config.num_nodes) + " = " + std::to_string(expected) +
          "; make them agree (torchrun --nproc-per-node / #SBATCH --ntasks-per-node must equal devices).");
    if (env_.local_rank >= static_cast<int>(devices.size()))
      throw MisconfigurationError("local rank " + std::to_string(env_.local_rank) + " has no device: only " +
                                  std::to_string(devices.size()) + " were given.");
    root_device_ = devices[static_cast<std::size_t>(env_.local_rank)];
    if constexpr (std::is_same_v<Backend, backend::NCCL>)
      kind_ = distributed::BackendKind::nccl;
    else if constexpr (std::is_same_v<Backend, backend::Gloo>)
      kind_ = distributed::BackendKind::gloo;
    else
      kind_ = root_device_.is_cuda() ? distributed::BackendKind::nccl : distributed::BackendKind::gloo;
  }

  template <class Accelerator>
  void setup_environment(Accelerator& accelerator) {
    accelerator.setup_device(root_device_);
    group_ = std::make_unique<distributed::ProcessGroup>(kind_, env_, options_.timeout, root_device_);
  }

  /// Broadcasts rank 0's parameters and buffers, then installs the gradient hooks.
  void setup_module(torch::nn::Module& module) {
    reducer_.reset();  // first: its destructor removes its hooks, which must not be the new ones
    at::NoGradGuard no_grad;
    std::vector<std::pair<std::string, at::Tensor>> named;
    std::vector<const void*> seen;  // tied weights: one tensor registered under two names counts once
    for (const auto& item : module.named_parameters()) {
      const void* impl = item.value().unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
      group().broadcast(item.value().detach(), 0);
      named.emplace_back(item.key(), item.value());
    }
    for (const auto& item : module.named_buffers()) group().broadcast(item.value(), 0);
    reducer_ = std::make_unique<distributed::GradientReducer>(
        group(), std::move(named),
        distributed::ReducerOptions{options_.first_bucket_bytes, options_.bucket_bytes, options_.find_unused_parameters});
  }
  void setup_optimizer(torch::optim::Optimizer&) {}
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    setup_module(module);
    for (auto* optimizer : optimizers) setup_optimizer(*optimizer);
  }
  void module_to_device(torch::nn::Module& module) { module.to(root_device_); }
  template <class Precision>
  auto module_init_context(Precision& precision, bool /*empty_init*/) {
    return detail::module_init_context_on(root_device_, precision);
  }

  template <class Batch>
  auto batch_to_device(const Batch& batch) const {
    return detail::move_batch(batch, root_device_);
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
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(distributed::GradientReducer* reducer) : reducer_(reducer) {
      if (reducer_) {
        previous_ = reducer_->sync();
        reducer_->set_sync(false);
      }
    }
    ~NoSyncGuard() {
      if (reducer_) reducer_->set_sync(previous_);
    }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    distributed::GradientReducer* reducer_;
    bool previous_ = true;
  };
  NoSyncGuard no_backward_sync(bool enabled = true) { return NoSyncGuard(enabled ? reducer_.get() : nullptr); }

  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module&, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    return detail::unscale_and_clip_norm(optimizer, max_norm, norm_type, error_if_nonfinite, precision);
  }
  template <class Precision>
  void clip_gradients_value(torch::nn::Module&, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    detail::unscale_and_clip_value(optimizer, clip_value, precision);
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
    const auto dims = at::tensor(local.sizes().vec(), at::TensorOptions().dtype(at::kLong)).to(root_device_);
    const auto all_dims = group().all_gather(dims);  // every rank's shape (same rank count of dims required)
    std::vector<std::int64_t> max_shape = local.sizes().vec();
    for (const auto& d : all_dims)
      for (std::size_t i = 0; i < max_shape.size(); ++i) max_shape[i] = std::max(max_shape[i], d[i].template item<std::int64_t>());
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
    auto size = at::scalar_tensor(static_cast<std::int64_t>(text.size()), at::kLong).to(root_device_);
    group().broadcast(size, src);
    auto bytes = at::empty({size.template item<std::int64_t>()}, at::TensorOptions().dtype(at::kByte));
    if (global_rank() == src) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    auto on_device = bytes.to(root_device_);
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
    auto votes = at::scalar_tensor(decision ? 1 : 0, at::kLong).to(root_device_);
    group().all_reduce(votes, ReduceOp::sum);
    const auto yes = votes.template item<std::int64_t>();
    return all ? yes == world_size() : yes > 0;
  }

  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) {
    return checkpoint::optimizer_state_dict(optimizer);
  }
  /// Only global rank 0 writes; then every rank waits for it.
  void save_checkpoint(const std::string& path, const StateDict& state) {
    if (is_global_zero()) checkpoint::save(path, state);
    barrier("save_checkpoint");
  }
  StateDict load_checkpoint(const std::string& path) { return checkpoint::load(path); }
  void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    checkpoint::load_module_state_dict(module, state, strict);  // module names carry no wrapper prefix
  }

  c10::Device root_device() const { return root_device_; }
  bool is_global_zero() const { return env_.rank == 0; }
  int global_rank() const { return env_.rank; }
  int local_rank() const { return env_.local_rank; }
  int node_rank() const { return env_.node_rank; }
  int world_size() const { return env_.world_size; }
  distributed::BackendKind backend_kind() const { return kind_; }
  const distributed::GradientReducer* reducer() const { return reducer_.get(); }
  void teardown() {
    reducer_.reset();
    group_.reset();
  }

 private:
  distributed::ProcessGroup& group() {
    if (!group_) throw MisconfigurationError("DDPStrategy: the process group is not set up yet (setup_environment).");
    return *group_;
  }

  DDPOptions options_;
  distributed::ClusterEnvironment env_;
  c10::Device root_device_{c10::kCPU};
  distributed::BackendKind kind_ = distributed::BackendKind::gloo;
  std::unique_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::GradientReducer> reducer_;
};

using DDPStrategy = BasicDDPStrategy<backend::Auto>;

}  // namespace fulgur
