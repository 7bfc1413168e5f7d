// fulgur::data::TensorLoader (include/fulgur/data/tensor_loader.hpp).
#include "fulgur/data/tensor_loader.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <string>

#include "fulgur/errors.hpp"
#include "src/data/tensor_pair.hpp"

namespace fulgur::data {

void detail::check_tensor_pair(const char* who, const at::Tensor& inputs, const at::Tensor& targets) {
  if (!inputs.defined() || !targets.defined() || inputs.dim() == 0 || targets.dim() == 0)
    throw DataError(std::string(who) + " needs defined inputs and targets with a first (sample) dimension.");
  if (inputs.size(0) != targets.size(0))
    throw DataError(std::string(who) + ": inputs have " + std::to_string(inputs.size(0)) +
                    " samples but targets have " + std::to_string(targets.size(0)) +
                    "; give both the same first dimension.");
}

TensorLoader::TensorLoader(at::Tensor inputs, at::Tensor targets, TensorLoaderOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  detail::check_tensor_pair("TensorLoader", inputs_, targets_);
  if (options_.batch_size <= 0)
    throw MisconfigurationError("TensorLoader: batch_size must be > 0, got " + std::to_string(options_.batch_size) +
                                ".");  // an option that cannot work, as DataLoader says it
}

at::Tensor TensorLoader::order_for_epoch(std::int64_t epoch) const {
  if (sampler_) return sampler_->indices(epoch);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<std::uint64_t>(epoch));
  return at::randperm(num_samples(), generator, at::TensorOptions().dtype(at::kLong));
}

std::string TensorLoader::describe() const {
  return "TensorLoader with " + std::to_string(dataset_size()) + " samples, batch_size " +
         std::to_string(options_.batch_size) + (options_.drop_last ? ", drop_last" : "") +
         (options_.shuffle ? ", shuffled" : "") +
         (sampler_ ? ", shard " + std::to_string(sampler_->options().rank) + " of " +
                         std::to_string(sampler_->options().world_size) + " (" + std::to_string(num_samples()) +
                         " samples)"
                   : std::string());
}

Batch TensorLoader::batch(std::int64_t index, const at::Tensor& order) const {
  const std::int64_t start = index * options_.batch_size;
  const std::int64_t length = std::min(options_.batch_size, num_samples() - start);
  if (!order.defined()) return Batch{inputs_.narrow(0, start, length), targets_.narrow(0, start, length)};
  auto ids = order.narrow(0, start, length).to(inputs_.device());
  return Batch{inputs_.index_select(0, ids), targets_.index_select(0, ids)};
}

}  // namespace fulgur::data
