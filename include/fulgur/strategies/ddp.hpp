#pragma once
// DDPStrategy — Lightning's "ddp": one process per device, replicas kept identical by averaging
// gradients over c10d. Gloo carries CPU tensors, NCCL CUDA tensors:
//   DDPStrategy                       = BasicDDPStrategy<backend::Auto>  (Gloo on CPU, NCCL on CUDA)
//   BasicDDPStrategy<backend::Gloo>   / BasicDDPStrategy<backend::NCCL>  to choose.
// Processes come from torchrun, SLURM (distributed/environment.hpp) or, with devices > 1 and
// neither, from fulgur's own launcher. Parameters and buffers are broadcast from rank 0 at setup;
// gradients are all-reduced in buckets while backward runs. Every collective has a timeout
// (DDPOptions::timeout). It inherits strategy_defaults and writes only what differs from one
// process on one device; what does not depend on the precision or the accelerator is compiled once,
// in libfulgur (distributed/data_parallel.hpp: the rendezvous, c10d, the gradient reducer).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/detail/meta_tensors.hpp"
#include "fulgur/distributed/data_parallel.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/parallel_devices.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/defaults.hpp"

namespace torch::nn {
class Module;
}

namespace fulgur {

namespace backend {
struct Auto {};  ///< Gloo for CPU devices, NCCL for CUDA devices
struct Gloo {};  ///< CPU tensors
struct NCCL {};  ///< CUDA tensors only
}  // namespace backend

/// Derived: a strategy that derives from this one and overrides a member the defaults call
/// themselves (setup_module, barrier, ...) names itself here, as with strategy_defaults<Derived>:
///   struct MyDDP : fulgur::BasicDDPStrategy<fulgur::backend::Auto, MyDDP> { void setup_module(...); };
template <class Backend, class Derived = void>
class BasicDDPStrategy
    : public strategy_defaults<std::conditional_t<std::is_void_v<Derived>, BasicDDPStrategy<Backend, void>, Derived>> {
  using Self = std::conditional_t<std::is_void_v<Derived>, BasicDDPStrategy<Backend, void>, Derived>;
  static_assert(std::is_same_v<Backend, backend::Auto> || std::is_same_v<Backend, backend::Gloo> ||
                    std::is_same_v<Backend, backend::NCCL>,
                "fulgur: the DDP backend must be backend::Auto, backend::Gloo or backend::NCCL.");

 public:
  static constexpr std::string_view name = "ddp";
  /// A profiler's "[Strategy]DDPStrategy..." actions (a class deriving from this one: its own name).
  static constexpr std::string_view class_name = std::is_void_v<Derived> ? "DDPStrategy" : "";
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
    core_ = std::make_unique<distributed::DataParallel>(parallel, options_);
    place_ = core_->environment();
    this->set_root_device(core_->device());
    accelerator.setup_device(this->root_device());
    core_->connect(backend_kind());
  }

  /// A model built on the meta device has no memory to move: the sharded strategy materialises it.
  void module_to_device(torch::nn::Module& module) {
    detail::refuse_meta_tensors(module, std::string(Self::name) + " cannot give it memory: ShardedStrategy<3> "
                                        "(\"fsdp\") materialises a model built in init_module(/*empty_init=*/true) "
                                        "at set-up; train it under that strategy, or build it with init_module().");
    strategy_defaults<Self>::module_to_device(module);
  }
  /// Broadcasts rank 0's parameters and buffers, then installs the gradient hooks.
  void setup_module(torch::nn::Module& module) { data_parallel().setup_module(module); }
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
    distributed::DataParallel& ddp = data_parallel();
    ddp.prepare_for_backward();
    try {
      precision.backward(loss, module);
    } catch (...) {
      ddp.abandon_backward();  // buckets already sent must not land later
      throw;
    }
    ddp.finalize_backward();
    precision.post_backward(loss, module);
  }
  /// While alive, backward accumulates gradients locally (no communication).
  using NoSyncGuard = distributed::NoSyncGuard;
  NoSyncGuard no_backward_sync(torch::nn::Module&, bool enabled = true) {
    return NoSyncGuard(enabled && core_ ? core_->sync_flag() : nullptr);
  }

  /// In place; also returned. mean of integer tensors truncates.
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::mean) {
    data_parallel().all_reduce(tensor, op);
    return tensor;
  }
  /// Shape (world_size, ...). Ranks may hold different first dimensions: then use
  /// all_gather_uneven, which returns one tensor per rank.
  at::Tensor all_gather(const at::Tensor& tensor) { return data_parallel().all_gather(tensor); }
  std::vector<at::Tensor> all_gather_uneven(const at::Tensor& tensor) { return data_parallel().all_gather_uneven(tensor); }
  at::Tensor broadcast(const at::Tensor& tensor, int src = 0) {
    data_parallel().broadcast(tensor, src);
    return tensor;
  }
  /// A string from src to every rank.
  std::string broadcast(const std::string& text, int src = 0) { return data_parallel().broadcast(text, src); }
  /// Any serialisable state (a StateDict of tensors, numbers, strings, nested dicts), pickled.
  StateDict broadcast(const StateDict& state, int src = 0) { return data_parallel().broadcast(state, src); }
  void barrier(std::string_view /*name*/ = {}) { data_parallel().barrier(); }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return data_parallel().reduce_boolean_decision(decision, all);
  }

  int global_rank() const { return place_.rank; }
  int local_rank() const { return place_.local_rank; }
  int node_rank() const { return place_.node_rank; }
  int world_size() const { return place_.world_size; }
  /// The gradient reducer of the module set up (null before): its buckets, for tests and diagnostics
  /// (src/distributed/reducer.hpp).
  const distributed::GradientReducer* reducer() const { return core_ ? core_->reducer() : nullptr; }
  void teardown() { core_.reset(); }

 protected:
  /// What libfulgur keeps for this strategy (set up by setup_environment).
  distributed::DataParallel& data_parallel() {
    if (!core_) throw MisconfigurationError("DDPStrategy: the process group is not set up yet (setup_environment).");
    return *core_;
  }
  const DDPOptions& options() const { return options_; }

 private:
  static constexpr DDPBackend backend_kind() {
    if constexpr (std::is_same_v<Backend, backend::NCCL>) return DDPBackend::nccl;
    else if constexpr (std::is_same_v<Backend, backend::Gloo>) return DDPBackend::gloo;
    else return DDPBackend::automatic;
  }
  DDPOptions options_;
  distributed::ClusterEnvironment place_;  // this process's place (read per step: kept here, inline)
  std::unique_ptr<distributed::DataParallel> core_;
};

using DDPStrategy = BasicDDPStrategy<backend::Auto>;

}  // namespace fulgur
