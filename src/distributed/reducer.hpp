#pragma once
// GradientReducer: averages gradients across the process group while backward still runs.
//
// Parameters are packed, in reverse registration order (roughly the order backward produces
// their gradients), into buckets of one dtype and device: the first capped at about 1 MiB so
// communication starts early, the rest at about 25 MiB. A post-accumulate-grad hook copies each
// gradient into its bucket; a full bucket is all-reduced asynchronously — always in bucket order,
// so every rank issues the same collectives in the same order. finalize_backward() waits for all
// of them, divides by the world size and writes the averages back into the gradients.
// A parameter appears once however often the module registers it (tied weights). Its hook is the
// parameter's post-accumulate-grad hook, on every parameter, frozen ones too: a hook set there
// before is replaced.
// The buckets hold the parameters that require grad. Unlike PyTorch's DDP, which keeps the set it
// was built with (a parameter unfrozen later is never averaged), a synchronised backward first
// compares each parameter's requires_grad with the layout's (one bool each, no communication) and,
// when one changed (BackboneFinetuning's unfreeze, toggle_optimizer), takes the previous layout back
// if it matches (alternating sets switch without allocating), else lays the buckets out again and
// checks with one small all-reduce that every rank laid out the same parameters.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/distributed/process_group.hpp"

namespace fulgur::distributed {

struct ReducerOptions {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  bool find_unused_parameters = false;
};

class GradientReducer {
 public:
  GradientReducer(ProcessGroup& group, std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                  ReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Arms the hooks for the coming backward (a no-op while sync is off).
  void prepare_for_backward();
  /// Completes the buckets (unused parameters: zeros, or an error naming them), waits for every
  /// all-reduce and writes the averaged gradients back.
  void finalize_backward();
  /// Called when backward threw: waits for the collectives already sent (so none writes into a
  /// buffer later) and refuses further backwards on this rank, whose collectives are now out of step.
  void abandon_backward() noexcept;
  /// Off: backward accumulates locally without communication (gradient accumulation micro-batches).
  /// Off: backward accumulates locally (NoSyncGuard turns it off for a micro-batch).
  bool* sync_flag() { return &sync_; }
  bool sync() const { return sync_; }

  std::size_t bucket_count() const;
  /// Bytes of the bucket buffers (a second copy of the gradients, as PyTorch's DDP keeps).
  std::int64_t buffer_bytes() const;
  /// Parameter names per bucket, in launch order (for tests and diagnostics).
  std::vector<std::vector<std::string>> bucket_layout() const;

  struct State;  // opaque

 private:
  std::unique_ptr<State> state_;
  bool sync_ = true;
};

}  // namespace fulgur::distributed
