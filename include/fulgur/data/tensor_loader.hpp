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

#include <cstdint>
#include <iterator>
#include <string>

#include "fulgur/data/batch.hpp"
#include "fulgur/data/distributed_sampler.hpp"

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
  TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options = {});

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
  /// predict's sharding: every sample on exactly one rank, none repeated (the ranks' shares differ by one at most).
  TensorLoader& shard_without_repeats(int rank, int world_size) {
    sampler_.emplace(dataset_size(), DistributedSamplerOptions{.rank = rank, .world_size = world_size,
                                                               .shuffle = options_.shuffle, .seed = options_.seed,
                                                               .pad = false});
    return *this;
  }
  const std::optional<DistributedSampler>& sampler() const { return sampler_; }
  /// The samples a shard repeats to even the ranks out (0 unsharded).
  std::int64_t repeated_samples() const { return sampler_ ? sampler_->repeated_samples() : 0; }
  void set_epoch(std::int64_t epoch) { next_epoch_ = epoch; }
  const TensorLoaderOptions& options() const { return options_; }

  /// The sample order of an epoch (what Python gets from randperm with seed + epoch, or from its
  /// DistributedSampler when sharded).
  at::Tensor order_for_epoch(std::int64_t epoch) const;

  std::string describe() const;

 private:
  Batch batch(std::int64_t index, const at::Tensor& order) const;

  at::Tensor inputs_, targets_;
  TensorLoaderOptions options_;
  std::optional<DistributedSampler> sampler_;
  mutable std::int64_t next_epoch_ = 0;
};

static_assert(std::input_iterator<TensorLoader::iterator>);

}  // namespace fulgur::data
