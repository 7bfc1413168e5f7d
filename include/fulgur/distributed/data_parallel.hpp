#pragma once
// DataParallel: the processes of a data-parallel run and what keeps their replicas identical,
// compiled once in libfulgur and shared by DDPStrategy and ShardedStrategy (which keep, in their
// headers, only what depends on the precision or the accelerator). It finds this process's place
// (torchrun, SLURM, or fulgur's own launcher), meets the others through c10d, broadcasts rank 0's
// weights at set-up, averages gradients in buckets while backward runs, and carries the
// collectives; every one of them has a timeout (DDPOptions::timeout): a lost peer is a
// DistributedError naming it, never a hang. c10d, the rendezvous and the gradient reducer stay in
// src/distributed/.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/distributed/environment.hpp"
#include "fulgur/parallel_devices.hpp"
#include "fulgur/state_dict.hpp"

namespace torch::nn {
class Module;
}

namespace fulgur {

/// DDPStrategy's options (Lightning: DDPStrategy(find_unused_parameters=..., timeout=...)),
/// given to the Trainer next to its config: Trainer<A, DDPStrategy, P> trainer(config, {.timeout = ...}).
struct DDPOptions {
  bool find_unused_parameters = false;  ///< off: a parameter without gradient is an error naming it
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< the first gradient bucket, sent early
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< every collective and the rendezvous
  /// Lightning's Trainer(sync_batchnorm=True): at set-up, the model's BatchNorm1d/2d/3d become
  /// fulgur::nn::SyncBatchNorm (nn/sync_batchnorm.hpp; one held by a typed member is refused, named).
  bool sync_batchnorm = false;
};

/// The communication backend a data-parallel strategy asks for.
enum class DDPBackend {
  automatic,  ///< Gloo for CPU devices, NCCL for CUDA devices
  gloo,
  nccl,
};

namespace distributed {

class ProcessGroup;     // src/distributed/process_group.hpp
class GradientReducer;  // src/distributed/reducer.hpp

/// While alive, backward accumulates gradients locally without communicating (gradient
/// accumulation micro-batches); made from a reducer's sync flag, or null: nothing to do.
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(bool* sync) : sync_(sync) {
    if (sync_) previous_ = std::exchange(*sync_, false);
  }
  ~NoSyncGuard() {
    if (sync_) *sync_ = previous_;
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  bool* sync_;
  bool previous_ = true;
};

class DataParallel {
 public:
  /// Finds this process's place and its device among `parallel`'s; with devices x num_nodes > 1 and
  /// no launcher around, this process becomes fulgur's launcher and never returns.
  DataParallel(const ParallelDevices& parallel, const DDPOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// This rank's device: the accelerator sets it up, then connect.
  c10::Device device() const;
  const ClusterEnvironment& environment() const;
  const DDPOptions& options() const;
  /// Meets the other processes.
  void connect(DDPBackend backend);
  ProcessGroup& group();

  /// Rank 0's parameters and buffers to every rank; returns the parameters by name, each once
  /// (tied weights: one tensor registered under two names counts once). Meta tensors are left.
  std::vector<std::pair<std::string, at::Tensor>> broadcast_module(torch::nn::Module& module);
  /// broadcast_module, then gradient hooks that average the gradients in buckets during backward.
  void setup_module(torch::nn::Module& module);
  void prepare_for_backward();
  void finalize_backward();
  /// Backward threw: the buckets already sent are waited for (none lands later).
  void abandon_backward() noexcept;
  /// The reducer's sync flag (null before setup_module), for NoSyncGuard.
  bool* sync_flag();
  /// The gradient reducer (null before setup_module), for tests and diagnostics.
  const GradientReducer* reducer() const;

  void all_reduce(const at::Tensor& tensor, ReduceOp op);
  at::Tensor all_gather(const at::Tensor& tensor);
  std::vector<at::Tensor> all_gather_uneven(const at::Tensor& tensor);
  void broadcast(const at::Tensor& tensor, int src);
  std::string broadcast(const std::string& text, int src);
  StateDict broadcast(const StateDict& state, int src);
  void barrier();
  bool reduce_boolean_decision(bool decision, bool all);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace distributed
}  // namespace fulgur
