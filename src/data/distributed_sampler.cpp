// fulgur::data::DistributedSampler (include/fulgur/data/distributed_sampler.hpp).
#include "fulgur/data/distributed_sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "fulgur/errors.hpp"

namespace fulgur::data {

DistributedSampler::DistributedSampler(std::int64_t dataset_size, DistributedSamplerOptions options)
    : size_(dataset_size), options_(options) {
  if (options_.world_size < 1)
    throw DataError("DistributedSampler: world_size must be >= 1, got " + std::to_string(options_.world_size) + ".");
  if (options_.rank < 0 || options_.rank >= options_.world_size)
    throw DataError("Invalid rank " + std::to_string(options_.rank) + ", rank should be in the interval [0, " +
                    std::to_string(options_.world_size - 1) + "]");
  const std::int64_t world = options_.world_size;
  // Fewer samples than ranks: unrepeated, some rank would have none, and a loop given no batches stops
  // the run; padded, each rank gets one (a sample repeated) — predict's output then repeats it.
  if (!options_.pad && size_ > 0 && size_ < world) options_.pad = true;
  if (!options_.pad) {  // len(range(rank, N, world))
    num_samples_ = size_ > options_.rank ? (size_ - options_.rank + world - 1) / world : 0;
    return;
  }
  num_samples_ = options_.drop_last && size_ % world != 0 ? (size_ - world + world - 1) / world  // ceil((N-W)/W)
                                                          : (size_ + world - 1) / world;          // ceil(N/W)
  if (num_samples_ < 0) num_samples_ = 0;
}

at::Tensor DistributedSampler::indices(std::int64_t epoch) const {
  const auto long_options = at::TensorOptions().dtype(at::kLong);
  at::Tensor order;
  if (options_.shuffle) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<std::uint64_t>(epoch));
    order = at::randperm(size_, generator, long_options);
  } else {
    order = at::arange(size_, long_options);
  }
  const std::int64_t total = total_size();
  if (!options_.pad) return order.slice(0, options_.rank, size_, options_.world_size).contiguous();
  if (total > size_) {  // pad with the first indices, repeated as often as needed
    const std::int64_t repeats = (total + size_ - 1) / size_;
    order = order.repeat({repeats}).narrow(0, 0, total);
  } else {
    order = order.narrow(0, 0, total);
  }
  return order.slice(0, options_.rank, total, options_.world_size).contiguous();
}

}  // namespace fulgur::data
