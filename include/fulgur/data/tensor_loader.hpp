#pragma once
// fulgur::data::TensorLoader: batches of in-memory tensors, optionally shuffled.
//
// The order of epoch e is `randperm(N, generator seeded with seed + e)`, the rule of Python's
// DistributedSampler, so an epoch's order depends only on (seed, epoch): a resumed run sees
// the same batches, and the order matches torch.randperm in Python bit for bit. The Trainer
// calls set_epoch(e) before each epoch; a plain range-for advances the epoch by itself.
//
// shard(rank, world_size) makes it shard-aware: each rank then iterates its own part, chosen by
// Python's DistributedSampler rule (data/distributed_sampler.hpp), before batching.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <iterator>
#include <string>

#include "fulgur/data/batch.hpp"
#include "fulgur/data/distributed_sampler.hpp"
#include "fulgur/errors.hpp"

#include <optional>

namespace fulgur::data {

struct TensorLoaderOptions {
  std::int64_t batch_size = 32;
  bool shuffle = false;
  bool drop_last = false;
  std::uint64_t seed = 0;
};

class TensorLoader {
 public:
  TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options = {})
      : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
    if (!inputs_.defined() || !targets_.defined() || inputs_.dim() == 0 || targets_.dim() == 0)
      throw DataError("TensorLoader needs defined inputs and targets with a first (sample) dimension.");
    if (inputs_.size(0) != targets_.size(0))
      throw DataError("TensorLoader: inputs have " + std::to_string(inputs_.size(0)) + " samples but targets have " +
                      std::to_string(targets_.size(0)) + "; give both the same first dimension.");
    if (options_.batch_size <= 0)
      throw DataError("TensorLoader: batch_size must be > 0, got " + std::to_string(options_.batch_size) + ".");
  }

  class iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    Batch operator*() const { return loader_->batch(index_, order_); }
    iterator& operator++() {
      ++index_;
      return *this;
    }
    void operator++(int) { ++index_; }
    friend bool operator==(const iterator& a, std::default_sentinel_t) { return a.index_ >= a.loader_->size(); }

   private:
    friend class TensorLoader;
    iterator(const TensorLoader* loader, at::Tensor order) : loader_(loader), order_(std::move(order)) {}
    const TensorLoader* loader_ = nullptr;
    at::Tensor order_;  // undefined when not shuffling
    std::int64_t index_ = 0;
  };

  /// Starts an epoch: the epoch set by set_epoch, or the one after the last begin().
  iterator begin() const {
    const std::int64_t epoch = next_epoch_++;
    return iterator(this, options_.shuffle || sampler_ ? order_for_epoch(epoch) : at::Tensor());
  }
  std::default_sentinel_t end() const { return {}; }

  /// The number of batches per epoch (of this rank's shard, when sharded).
  std::int64_t size() const {
    const std::int64_t n = num_samples(), b = options_.batch_size;
    return options_.drop_last ? n / b : (n + b - 1) / b;
  }
  /// Samples per epoch seen by this loader (this rank's share when sharded).
  std::int64_t num_samples() const { return sampler_ ? sampler_->num_samples() : dataset_size(); }
  std::int64_t dataset_size() const { return inputs_.size(0); }

  /// Iterate only this rank's part of the data (Python's DistributedSampler rule; drop_last here
  /// drops the uneven tail instead of padding it with repeated samples).
  TensorLoader& shard(int rank, int world_size, bool drop_last = false) {
    sampler_.emplace(dataset_size(), DistributedSamplerOptions{rank, world_size, options_.shuffle, options_.seed, drop_last});
    return *this;
  }
  const std::optional<DistributedSampler>& sampler() const { return sampler_; }
  void set_epoch(std::int64_t epoch) { next_epoch_ = epoch; }
  const TensorLoaderOptions& options() const { return options_; }

  /// The sample order of an epoch (what Python gets from randperm with seed + epoch, or from its
  /// DistributedSampler when sharded).
  at::Tensor order_for_epoch(std::int64_t epoch) const {
    if (sampler_) return sampler_->indices(epoch);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<std::uint64_t>(epoch));
    return at::randperm(num_samples(), generator, at::TensorOptions().dtype(at::kLong));
  }

  std::string describe() const {
    return "TensorLoader with " + std::to_string(dataset_size()) + " samples, batch_size " +
           std::to_string(options_.batch_size) + (options_.drop_last ? ", drop_last" : "") +
           (options_.shuffle ? ", shuffled" : "") +
           (sampler_ ? ", shard " + std::to_string(sampler_->options().rank) + " of " +
                           std::to_string(sampler_->options().world_size) + " (" + std::to_string(num_samples()) +
                           " samples)"
                     : std::string());
  }

 private:
  Batch batch(std::int64_t index, const at::Tensor& order) const {
    const std::int64_t start = index * options_.batch_size;
    const std::int64_t length = std::min(options_.batch_size, num_samples() - start);
    if (!order.defined()) return Batch{inputs_.narrow(0, start, length), targets_.narrow(0, start, length)};
    auto ids = order.narrow(0, start, length).to(inputs_.device());
    return Batch{inputs_.index_select(0, ids), targets_.index_select(0, ids)};
  }

  at::Tensor inputs_, targets_;
  TensorLoaderOptions options_;
  std::optional<DistributedSampler> sampler_;
  mutable std::int64_t next_epoch_ = 0;
};

static_assert(std::input_iterator<TensorLoader::iterator>);

}  // namespace fulgur::data
