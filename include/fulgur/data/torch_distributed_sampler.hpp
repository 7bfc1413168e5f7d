#pragma once
// fulgur::data::TorchDistributedSampler: a torch::data sampler with Python's DistributedSampler
// rule (see distributed_sampler.hpp), for torch::data datasets:
//
//   fulgur::data::TorchDistributedSampler sampler(dataset.size().value(),
//       {.rank = trainer.global_rank(), .world_size = trainer.world_size(), .seed = 0});
//   auto loader = torch::data::make_data_loader(std::move(dataset), sampler, options);
//   sampler.set_epoch(e);   // reaches the loader's copy: copies share their epoch
//
// make_data_loader copies the sampler, which is why LibTorch's own DistributedRandomSampler's
// set_epoch on the user's object does nothing; this one keeps its epoch in shared state. Each
// reset() (a new pass over the loader) uses the current epoch, then advances it, so a plain
// loop gets a new order every epoch too.
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <optional>
#include <vector>

#include "fulgur/data/distributed_sampler.hpp"

namespace fulgur::data {

class TorchDistributedSampler : public torch::data::samplers::Sampler<std::vector<std::size_t>> {
 public:
  TorchDistributedSampler(std::size_t dataset_size, DistributedSamplerOptions options)
      : shared_(std::make_shared<Shared>(Shared{DistributedSampler(static_cast<std::int64_t>(dataset_size), options), 0})) {}

  void set_epoch(std::int64_t epoch) { shared_->epoch = epoch; }
  std::int64_t epoch() const { return shared_->epoch; }

  void reset(std::optional<std::size_t> new_size = std::nullopt) override {
    if (new_size)
      shared_->sampler =
          DistributedSampler(static_cast<std::int64_t>(*new_size), shared_->sampler.options());
    const at::Tensor order = shared_->sampler.indices(shared_->epoch++);
    const auto* data = order.data_ptr<std::int64_t>();
    indices_.assign(data, data + order.numel());
    position_ = 0;
  }

  std::optional<std::vector<std::size_t>> next(std::size_t batch_size) override {
    if (position_ >= indices_.size()) return std::nullopt;
    const std::size_t end = std::min(indices_.size(), position_ + batch_size);
    std::vector<std::size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                                   indices_.begin() + static_cast<std::ptrdiff_t>(end));
    position_ = end;
    return batch;
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("epoch", at::scalar_tensor(shared_->epoch, at::kLong), /*is_buffer=*/true);
    archive.write("position", at::scalar_tensor(static_cast<std::int64_t>(position_), at::kLong), true);
  }
  /// Restores the epoch and the position within the pass that was running when saved.
  void load(torch::serialize::InputArchive& archive) override {
    at::Tensor epoch, position;
    archive.read("epoch", epoch, /*is_buffer=*/true);
    archive.read("position", position, true);
    shared_->epoch = epoch.item<std::int64_t>();
    indices_.clear();
    if (shared_->epoch > 0) {  // the running pass used the epoch before the saved (next) one
      const auto order = shared_->sampler.indices(shared_->epoch - 1);
      indices_.assign(order.data_ptr<std::int64_t>(), order.data_ptr<std::int64_t>() + order.numel());
    }
    position_ = static_cast<std::size_t>(position.item<std::int64_t>());
  }

 private:
  struct Shared {
    DistributedSampler sampler;
    std::int64_t epoch;
  };
  std::shared_ptr<Shared> shared_;
  std::vector<std::size_t> indices_;
  std::size_t position_ = 0;
};

}  // namespace fulgur::data
