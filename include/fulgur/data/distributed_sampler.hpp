#pragma once
// fulgur::data::DistributedSampler: which samples each rank sees, by Python's
// torch.utils.data.DistributedSampler rule exactly — randperm(N) seeded with seed + epoch (or
// 0..N-1 without shuffle), padded after the shuffle by repeating the first indices up to a
// multiple of world_size (or truncated to one with drop_last), then indices[rank::world_size].
// Every rank gets the same number of samples, disjoint up to the padding, and a new order each epoch.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace fulgur::data {

struct DistributedSamplerOptions {
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;  ///< drop the tail that does not divide evenly instead of padding
  /// false: no sample repeated, the ranks' shares differ by one at most (Lightning's
  /// UnrepeatedDistributedSampler, what predict shards with); drop_last is then ignored.
  bool pad = true;
};

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, DistributedSamplerOptions options);

  /// This rank's sample indices for `epoch` (int64, on the CPU).
  at::Tensor indices(std::int64_t epoch) const;

  std::int64_t num_samples() const { return num_samples_; }
  /// The samples all ranks see together, repeated ones included.
  std::int64_t total_size() const { return options_.pad ? num_samples_ * options_.world_size : size_; }
  /// How many of them repeat a sample to even the ranks' shares out (padding).
  std::int64_t repeated_samples() const { return std::max<std::int64_t>(total_size() - size_, 0); }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  std::int64_t size_;
  DistributedSamplerOptions options_;
  std::int64_t num_samples_ = 0;
};

}  // namespace fulgur::data
