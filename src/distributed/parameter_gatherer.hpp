#pragma once
// ParameterGatherer: stage 3's parameters, whole only while they are used. LibTorch's modules have
// no forward hooks, so the wrapped submodule's boundary is seen where its parameters are: every
// ATen op this thread (and autograd's threads for it) runs is looked at before it runs (a
// thread-local RecordFunction callback over the op's inputs), and an input whose storage is a
// released bucket's has that bucket's whole unit gathered first. Correct for any model — a
// parameter read anywhere, in forward or backward, is whole when read — and it frees by a rule:
// the first use of another wrapped unit releases the unit used before it (the root unit, the
// parameters no wrapped submodule holds, stays until the end of backward or the step, as FSDP's
// root). A model whose units interleave (weights shared across units) stays correct and gathers
// more often. Prefetch: the first step records the order units are needed in (forward, then
// backward); later steps, on gathering a unit, start the all-gather of the next one into a buffer
// of its own, which becomes the unit's storage when an op first needs it (so no op reads a buffer
// still being written). The gathers are collectives: every rank must run the same ops in the same
// order (as under FSDP).
#include <cstdint>
#include <memory>
#include <vector>

#include "src/distributed/optimizer_shard.hpp"

namespace fulgur::distributed {

class ParameterGatherer {
 public:
  struct Entry {
    OptimizerShard* owner = nullptr;
    OptimizerShard::Bucket* bucket = nullptr;
    std::int64_t unit = 0;  // the wrapped submodule; 0: the root
  };
  /// Installs the callback on this thread (autograd's threads inherit it); every entry's bucket is
  /// released (at rest) at this point.
  explicit ParameterGatherer(std::vector<Entry> entries);
  ~ParameterGatherer();  // removes the callback; must run on the thread that made it
  ParameterGatherer(const ParameterGatherer&) = delete;
  ParameterGatherer& operator=(const ParameterGatherer&) = delete;

  /// Every unit's buckets gathered (the module whole, e.g. for its state_dict or after fit).
  void gather_all();
  /// Every gathered bucket released (after backward; after a step, whose shards changed).
  void release_all();
  /// A gather that failed during an op (a lost peer), thrown here: LibTorch's callbacks cannot
  /// throw into the op, which ran on an unfilled buffer. The strategy calls it from its verbs
  /// (backward, the step, checkpoints) before anything is stepped or saved.
  void rethrow_failure() const;

  /// Statistics for tests and docs: gathers done (one per unit gathered), bytes of whole buckets
  /// held now and at most since the last reset_peak.
  std::int64_t gathers() const;
  /// Of those, gathers issued ahead of use (the next unit of the order the first step recorded).
  std::int64_t prefetches() const;
  bool all_gathered() const;
  std::int64_t gathered_bytes() const;
  std::int64_t peak_gathered_bytes() const;
  void reset_peak();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace fulgur::distributed
