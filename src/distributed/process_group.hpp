#pragma once
// fulgur::distributed::ProcessGroup: the processes of a run, connected through c10d — a TCPStore
// rendezvous and a Gloo (CPU tensors) or NCCL (CUDA tensors) backend. Every operation waits at
// most the group's timeout: a lost peer is a DistributedError naming the operation and the rank,
// never a hang. (c10d's headers stay in src/distributed/.)
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/distributed/environment.hpp"

namespace fulgur::distributed {

enum class BackendKind { gloo, nccl };

/// A collective in flight.
class PendingCollective {
 public:
  PendingCollective();
  ~PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  /// Waits for completion; failure or timeout is a DistributedError naming the operation and rank.
  void wait();
  bool valid() const { return impl_ != nullptr; }

 private:
  friend class ProcessGroup;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  /// Meets the other processes through a TCPStore (served by rank 0, or by torchrun's agent) and
  /// connects the backend. Waits at most `timeout` for every peer. `device`: this rank's device
  /// (NCCL binds its communicators to it).
  ProcessGroup(BackendKind kind, const ClusterEnvironment& env, std::chrono::milliseconds timeout,
               c10::Device device = c10::Device(c10::kCPU));
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  BackendKind kind() const;
  std::chrono::milliseconds timeout() const;

  /// In place. mean: SUM then divide (integer tensors truncate), as Gloo has no AVG.
  void all_reduce(const at::Tensor& tensor, ReduceOp op);
  /// In place, SUM, returns at once; wait() on the result.
  PendingCollective all_reduce_sum_async(const at::Tensor& tensor);
  /// In place: every rank receives src's tensor (same shape and dtype everywhere).
  void broadcast(const at::Tensor& tensor, int src);
  /// One tensor per rank, in rank order (same shape and dtype everywhere).
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// Into `output` (contiguous, size() times input's numel, input's dtype): rank r's input lands in
  /// its r-th chunk. No tensor is returned, so a caller keeps one buffer across steps.
  void all_gather_into(const at::Tensor& output, const at::Tensor& input);
  /// all_gather_into that returns at once: wait() on the result before reading `output`.
  PendingCollective all_gather_into_async(const at::Tensor& output, const at::Tensor& input);
  /// Sums `input` (contiguous, size() times output's numel) over the ranks and leaves its r-th chunk
  /// in rank r's `output`; returns at once: wait() on the result.
  PendingCollective reduce_scatter_sum_async(const at::Tensor& output, const at::Tensor& input);
  void barrier();

  struct Impl;  // opaque: c10d's types live in src/

 private:
  /// A collective started by `launch` (which returns c10d's work), named `op` in its errors.
  template <class Launch>
  PendingCollective start(const char* op, Launch&& launch);  // defined and used in process_group.cpp only
  std::unique_ptr<Impl> impl_;
};

}  // namespace fulgur::distributed
