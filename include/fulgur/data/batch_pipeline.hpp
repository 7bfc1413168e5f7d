#pragma once
// fulgur::data::detail::BatchPipeline: the worker threads behind a DataLoader epoch, compiled once in
// libfulgur. Workers take batch numbers in order and fill the slot `batch % slots`; at most `slots`
// batches are in flight (made and not yet taken). The consumer takes batches in order, so the
// output order is the sampler's whatever thread made which batch. A batch whose making threw is
// rethrown when the consumer reaches it, in its place; the batches after it are made as usual (a
// consumer may log the error and go on, as with Python's DataLoader). Destroying the pipeline stops
// the workers and joins them (within the batch each is making). The slots themselves live in the typed caller (data_loader.hpp); the pipeline's mutex
// orders a worker's write of a slot before the consumer's read.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace fulgur::data::detail {

class BatchPipeline {
 public:
  /// Makes batch `batch` into slot `slot` on worker `worker` (0-based); may throw.
  using Produce = std::function<void(std::int64_t batch, std::size_t slot, int worker)>;

  BatchPipeline(int workers, std::size_t slots, std::int64_t first_batch, std::int64_t end_batch, Produce produce);
  ~BatchPipeline();
  BatchPipeline(const BatchPipeline&) = delete;
  BatchPipeline& operator=(const BatchPipeline&) = delete;

  /// Waits until `batch` is made and returns its slot; rethrows what making it threw (the batch is
  /// then taken: no release).
  std::size_t acquire(std::int64_t batch);
  /// The consumer is done with `batch`'s slot: a worker may reuse it.
  void release(std::int64_t batch);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fulgur::data::detail
