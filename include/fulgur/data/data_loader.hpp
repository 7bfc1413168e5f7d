#pragma once
// fulgur::data::DataLoader: batches from a map-style dataset, made ahead by worker threads.
//
//   fulgur::data::DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .num_workers = 2});
//   trainer.fit(model, loader);
//
// A dataset is any type with `size()` and `get(index)` (or `get(index, at::Generator&)`) callable on
// a const object — `get` is called from several threads at once. What `get` returns is collated as
// Python's default_collate does (data/collate.hpp); a dataset with `get_batch(std::span<const
// std::int64_t>)` is read a batch at a time instead (no per-sample calls).
//
// The order of epoch e is a function of (seed, epoch) only — sequential, `randperm` seeded with
// seed + e (shuffle; Python's DistributedSampler rule, as TensorLoader), this rank's part under DDP
// (shard), or a user sampler's `indices(epoch)` — and each sample's random draws come from a
// generator seeded by (seed, epoch, index) that get(index, generator) receives. So the batches are
// bit-identical for any num_workers, and a resumed fit starts mid-epoch with begin_at(batch) without
// reading the samples before it. num_workers = 0 makes each batch on the calling thread when it is
// asked for; N > 0 starts N threads per epoch that keep prefetch_factor * N batches ready, in order.
// An exception in get or collate reaches the caller as a DataError naming the sample, the batch and
// the worker, with the original exception nested (std::rethrow_if_nested); the workers are joined
// when the epoch's iterator goes away, also mid-epoch.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <exception>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/data/batch_pipeline.hpp"
#include "fulgur/data/collate.hpp"
#include "fulgur/data/distributed_sampler.hpp"
#include "fulgur/data/pinned_memory.hpp"

namespace fulgur::data {

struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  int num_workers = 0;      ///< threads making batches ahead; 0: on the calling thread, when asked for
  int prefetch_factor = 2;  ///< batches kept ready per worker
  bool pin_memory = false;  ///< page-locked batches for CUDA copies (see docs/data.md)
  std::uint64_t seed = 0;   ///< the shuffle's and the per-sample generators' seed
};

template <class D>
concept sized_dataset = requires(const D& d) {
  { d.size() } -> std::convertible_to<std::int64_t>;
};
template <class D>
concept dataset_with_generator = requires(const D& d, std::int64_t i, at::Generator& g) { d.get(i, g); };
template <class D>
concept dataset_without_generator = requires(const D& d, std::int64_t i) { d.get(i); };
template <class D>
concept batched_dataset = requires(const D& d, std::span<const std::int64_t> indices) { d.get_batch(indices); };

/// A map-style dataset: size() and get(index) [or get(index, at::Generator&)] on a const object.
template <class D>
concept map_dataset = sized_dataset<D> && (dataset_with_generator<D> || dataset_without_generator<D> || batched_dataset<D>);

namespace detail::range_for {
using std::begin;
using std::end;
/// What a range-for over R needs (begin/end as members or found by ADL, an input iterator) and integer
/// elements: std::ranges::input_range's test, written against <iterator> because <ranges> alone costs every
/// translation unit that includes fulgur.hpp ~5 MB of g++'s memory and ~0.2 s of clang's time.
template <class R>
concept integer_range = requires(R& r) {
  { begin(r) } -> std::input_iterator;
  { end(r) } -> std::sentinel_for<decltype(begin(r))>;
} && std::integral<std::iter_value_t<decltype(begin(std::declval<R&>()))>>;
}  // namespace detail::range_for

/// A user sampler: the sample indices of an epoch, any range of integers.
template <class S>
concept user_sampler = requires(const S& s, std::int64_t epoch) { s.indices(epoch); } &&
                       detail::range_for::integer_range<decltype(std::declval<const S&>().indices(std::int64_t{}))>;

namespace detail {
/// Thrown by a worker whose epoch is being destroyed: its batch is never taken.
struct Abandoned {};
/// The generator sample `index` of `epoch` draws from: seeded by (seed, epoch, index) only.
at::Generator sample_generator(std::uint64_t seed, std::int64_t epoch, std::int64_t index);
/// The sampler's order of an epoch as an int64 tensor; undefined means 0, 1, ..., n - 1.
struct EpochOrder {
  EpochOrder(at::Tensor order, std::int64_t length);  // order: int64, contiguous, on the CPU
  at::Tensor indices;
  std::int64_t size = 0;
  const std::int64_t* data = nullptr;  // indices' data: read per sample, so looked up once
  std::int64_t operator[](std::int64_t position) const { return data ? data[position] : position; }
};
using SamplerFn = std::function<std::vector<std::int64_t>(std::int64_t epoch)>;
EpochOrder epoch_order(std::int64_t dataset_size, const DataLoaderOptions& options,
                       const std::optional<DistributedSampler>& shard, const SamplerFn& sampler,
                       std::int64_t user_sampler_size, std::int64_t epoch);
std::int64_t user_sampler_length(const SamplerFn& sampler);
void check_options(const DataLoaderOptions& options, std::int64_t dataset_size, bool has_user_sampler);
[[noreturn]] void raise_sample_failure(std::int64_t index, std::int64_t batch, int worker);
[[noreturn]] void raise_batch_failure(const char* step, std::int64_t batch, std::span<const std::int64_t> indices,
                                      int worker);
[[noreturn]] void raise_negative_first_batch(std::int64_t first_batch);
[[noreturn]] void raise_out_of_order(std::int64_t batch, std::int64_t next, std::int64_t num_batches);
void check_shard(int rank, int world_size);
/// pin_memory with batches map_tensors cannot walk: said once, the batches stay pageable.
void say_batches_not_pinned();
/// The epoch the next begin() starts; begin() may run on several threads at once.
class EpochCounter {
 public:
  EpochCounter() = default;
  EpochCounter(const EpochCounter& other) : next_(other.next_.load()) {}
  EpochCounter& operator=(const EpochCounter& other) {
    next_ = other.next_.load();
    return *this;
  }
  std::int64_t take() { return next_.fetch_add(1); }
  void set(std::int64_t epoch) { next_ = epoch; }

 private:
  std::atomic<std::int64_t> next_{0};
};
std::string describe_loader(std::int64_t dataset_size, std::int64_t num_samples, const DataLoaderOptions& options,
                            const std::optional<DistributedSampler>& shard, bool user_sampler);

template <class D>
auto get_sample(const D& dataset, std::int64_t index, std::uint64_t seed, std::int64_t epoch) {
  if constexpr (dataset_with_generator<D>) {
    at::Generator generator = sample_generator(seed, epoch, index);
    return dataset.get(index, generator);
  } else {
    return dataset.get(index);
  }
}
template <class D>
using sample_of = decltype(get_sample(std::declval<const D&>(), 0, 0, 0));

/// What a DataLoader over a type that is not a dataset yields: its static_assert is the one error.
struct not_a_dataset {};
template <class D, class Collate>
struct loader_batch {
  using type = not_a_dataset;
};
template <class D, class Collate>
  requires map_dataset<D> && (!batched_dataset<D> || !std::same_as<Collate, DefaultCollate>) &&
           std::invocable<const Collate&, std::span<const sample_of<D>>>
struct loader_batch<D, Collate> {
  using type = std::invoke_result_t<const Collate&, std::span<const sample_of<D>>>;
};
template <class D, class Collate>
  requires map_dataset<D> && batched_dataset<D> && std::same_as<Collate, DefaultCollate>
struct loader_batch<D, Collate> {
  using type = decltype(std::declval<const D&>().get_batch(std::span<const std::int64_t>()));
};
}  // namespace detail

template <class Dataset, class Collate = DefaultCollate>
class DataLoader {
  static_assert(sized_dataset<Dataset>,
                "fulgur::data::DataLoader: the dataset has no `size() const` returning its number of samples.");
  static_assert(!sized_dataset<Dataset> || map_dataset<Dataset>,
                "fulgur::data::DataLoader: the dataset has no `get(std::int64_t index) const` (or `get(index, "
                "at::Generator&) const`) returning a sample.");
  static_assert(!requires(const Collate& c) { c.indices(std::int64_t{}); },
                "fulgur::data::DataLoader: the third argument has indices(epoch), so it looks like a sampler, but "
                "they are not integers: a sampler's indices(epoch) returns a range of integers (std::int64_t).");
  static constexpr bool valid = map_dataset<Dataset>;  // else the static_asserts above are the errors
  static constexpr bool reads_batches = batched_dataset<Dataset> && std::same_as<Collate, DefaultCollate>;

 public:
  using batch_type = typename detail::loader_batch<Dataset, Collate>::type;

 private:
  // Whether pin_memory can reach every tensor of a batch: map_tensors walks the type and gives it back.
  static constexpr bool pinnable = [] {
    if constexpr (tensor_traversable<batch_type>)
      return std::same_as<decltype(map_tensors(std::declval<const batch_type&>(), &data::pin_memory)), batch_type>;
    else
      return false;
  }();
  void check_pinnable() const {
    if (options_.pin_memory && !pinnable) detail::say_batches_not_pinned();
  }

 public:

  explicit DataLoader(Dataset dataset, DataLoaderOptions options = {}, Collate collate = {})
      : core_(std::make_shared<const Core>(std::move(dataset), std::move(collate))), options_(options) {
    detail::check_options(options_, dataset_size(), false);
    check_pinnable();
  }
  template <user_sampler Sampler>
  DataLoader(Dataset dataset, DataLoaderOptions options, Sampler sampler, Collate collate = {})
      : core_(std::make_shared<const Core>(std::move(dataset), std::move(collate))), options_(options) {
    sampler_ = [s = std::move(sampler)](std::int64_t epoch) {
      std::vector<std::int64_t> out;
      for (auto i : s.indices(epoch)) out.push_back(static_cast<std::int64_t>(i));
      return out;
    };
    detail::check_options(options_, dataset_size(), true);
    check_pinnable();
    sampler_size_ = detail::user_sampler_length(sampler_);
  }

  class iterator;

  /// Starts an epoch: the epoch set by set_epoch, or the one after the last begin().
  iterator begin() const { return begin_at(0); }
  /// Starts an epoch at its batch `first_batch`, without reading the samples of the batches before.
  iterator begin_at(std::int64_t first_batch) const {
    if (first_batch < 0) detail::raise_negative_first_batch(first_batch);
    first_batch = std::min(first_batch, size());  // past the end: an epoch with nothing left
    return iterator(std::make_shared<Epoch>(*this, next_epoch_.take(), first_batch), first_batch);
  }
  std::default_sentinel_t end() const { return {}; }

  /// Batches per epoch (of this rank's part, when sharded).
  std::int64_t size() const {
    const std::int64_t n = num_samples(), b = options_.batch_size;
    return options_.drop_last ? n / b : n / b + (n % b != 0);
  }
  /// Samples per epoch (this rank's part when sharded).
  std::int64_t num_samples() const {
    if (shard_) return shard_->num_samples();
    return sampler_ ? sampler_size_ : dataset_size();
  }
  std::int64_t dataset_size() const {
    if constexpr (sized_dataset<Dataset>) return static_cast<std::int64_t>(core_->dataset.size());
    else return 0;
  }
  const Dataset& dataset() const { return core_->dataset; }
  const DataLoaderOptions& options() const { return options_; }

  /// Iterate only this rank's part (Python's DistributedSampler rule over the sampler's order).
  DataLoader& shard(int rank, int world_size, bool drop_last = false) {
    detail::check_shard(rank, world_size);
    shard_.emplace(num_samples_unsharded(),
                   DistributedSamplerOptions{rank, world_size, options_.shuffle, options_.seed, drop_last});
    return *this;
  }
  /// predict's sharding: every sample on exactly one rank, none repeated (the ranks' shares differ by one at most).
  DataLoader& shard_without_repeats(int rank, int world_size) {
    detail::check_shard(rank, world_size);
    shard_.emplace(num_samples_unsharded(), DistributedSamplerOptions{.rank = rank, .world_size = world_size,
                                                                      .shuffle = options_.shuffle,
                                                                      .seed = options_.seed, .pad = false});
    return *this;
  }
  /// The samples a shard repeats to even the ranks out (0 unsharded).
  std::int64_t repeated_samples() const { return shard_ ? shard_->repeated_samples() : 0; }
  void set_epoch(std::int64_t epoch) { next_epoch_.set(epoch); }

  /// The sample indices of an epoch, in order (what the batches of that epoch read).
  at::Tensor order_for_epoch(std::int64_t epoch) const {
    auto order = make_order(epoch);
    return order.indices.defined() ? order.indices : at::arange(order.size, at::kLong);
  }
  std::string describe() const {
    return detail::describe_loader(dataset_size(), num_samples(), options_, shard_, static_cast<bool>(sampler_));
  }

 private:
  std::int64_t num_samples_unsharded() const { return sampler_ ? sampler_size_ : dataset_size(); }
  detail::EpochOrder make_order(std::int64_t epoch) const {
    return detail::epoch_order(dataset_size(), options_, shard_, sampler_, sampler_size_, epoch);
  }

  // What the loader's copies and its epochs share: set at construction, never changed after.
  struct Core {
    Core(Dataset d, Collate c) : dataset(std::move(d)), collate(std::move(c)) {}
    Dataset dataset;
    Collate collate;
  };

  // One epoch's batches: the order, the slots the workers fill, the workers. It owns what it reads
  // (the core, its options, its order), so an iterator may outlive the loader it came from.
  struct Epoch {
    Epoch(const DataLoader& loader, std::int64_t epoch_number, std::int64_t first_batch)
        : core(loader.core_),
          options(loader.options_),
          epoch(epoch_number),
          order(loader.make_order(epoch_number)),
          num_batches(loader.size()),
          next_take(first_batch) {
      const std::int64_t remaining = num_batches - first_batch;
      const int workers = static_cast<int>(std::min<std::int64_t>(options.num_workers, remaining));
      if (workers <= 0) return;
      // prefetch_factor x workers slots, no more than the epoch has batches left
      slots.resize(static_cast<std::size_t>(std::min<std::int64_t>(
          static_cast<std::int64_t>(options.prefetch_factor) * workers, remaining)));
      pipeline.emplace(workers, slots.size(), first_batch, num_batches,
                       [this](std::int64_t batch, std::size_t slot, int worker) { slots[slot] = make(batch, worker); });
    }

    /// Batch `batch`, once, in order (on the consumer's thread). A batch whose making threw throws
    /// the same again if asked for again; the epoch goes on with the next one.
    batch_type take(std::int64_t batch) {
      if (batch >= num_batches || batch != next_take) {
        if (batch == failed_batch) std::rethrow_exception(failure);
        detail::raise_out_of_order(batch, next_take, num_batches);
      }
      next_take = batch + 1;
      try {
        if (!pipeline) return make(batch, -1);
        const std::size_t slot = pipeline->acquire(batch);
        batch_type out = std::move(*slots[slot]);
        slots[slot].reset();
        pipeline->release(batch);
        return out;
      } catch (...) {
        failed_batch = batch;
        failure = std::current_exception();
        throw;
      }
    }
    /// Passes over `batch` unread (a ++ without a *): it is still taken, so the workers go on.
    void skip(std::int64_t batch) {
      if (batch != next_take || batch >= num_batches) return;  // read already, or nothing there
      try {
        (void)take(batch);
      } catch (...) {  // its error belongs to whoever reads it; nobody will
      }
    }

    /// Batch `batch` of the epoch, in page-locked memory when pin_memory asks for it (and can be had).
    batch_type make(std::int64_t batch, int worker) const {
      detail::PinnedAllocationScope pinned(options.pin_memory);  // collate allocates in pinned memory
      batch_type out = read(batch, worker);
      // what collate did not allocate itself (numbers, a user collate's or get_batch's tensors)
      if constexpr (pinnable) {
        if (detail::allocating_pinned()) return map_tensors(out, &data::pin_memory);
      }
      return out;
    }

    batch_type read(std::int64_t batch, int worker) const {
      const std::int64_t start = batch * options.batch_size;
      const std::int64_t length = std::min(options.batch_size, order.size - start);
      if constexpr (!valid) {
        return batch_type{};
      } else if constexpr (reads_batches) {
        std::vector<std::int64_t> indices(static_cast<std::size_t>(length));
        for (std::int64_t j = 0; j < length; ++j) indices[static_cast<std::size_t>(j)] = order[start + j];
        try {
          return core->dataset.get_batch(std::span<const std::int64_t>(indices));
        } catch (...) {
          detail::raise_batch_failure("get_batch", batch, indices, worker);
        }
      } else {
        using Sample = detail::sample_of<Dataset>;
        std::vector<Sample> samples;
        samples.reserve(static_cast<std::size_t>(length));
        for (std::int64_t j = 0; j < length; ++j) {
          if (abandoned.load(std::memory_order_relaxed)) throw detail::Abandoned{};  // the epoch is going away
          const std::int64_t index = order[start + j];
          try {
            samples.push_back(detail::get_sample(core->dataset, index, options.seed, epoch));
          } catch (...) {
            detail::raise_sample_failure(index, batch, worker);
          }
        }
        try {
          return core->collate(std::span<const Sample>(samples));
        } catch (...) {
          std::vector<std::int64_t> indices(static_cast<std::size_t>(length));
          for (std::int64_t j = 0; j < length; ++j) indices[static_cast<std::size_t>(j)] = order[start + j];
          detail::raise_batch_failure("collate", batch, indices, worker);
        }
      }
    }

    ~Epoch() {
      abandoned = true;
      pipeline.reset();  // joins the workers before the slots go
    }
    Epoch(const Epoch&) = delete;
    Epoch& operator=(const Epoch&) = delete;

    std::shared_ptr<const Core> core;
    DataLoaderOptions options;
    std::int64_t epoch;
    detail::EpochOrder order;
    std::int64_t num_batches;
    std::int64_t next_take;  // the consumer's side: the first batch not taken yet
    std::int64_t failed_batch = -1;
    std::exception_ptr failure;
    std::vector<std::optional<batch_type>> slots;
    std::atomic<bool> abandoned{false};  // set first when the epoch goes: workers stop between samples
    std::optional<detail::BatchPipeline> pipeline;
  };

 public:
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    const batch_type& operator*() const {
      if (!current_) current_.emplace(epoch_->take(batch_));
      return *current_;
    }
    iterator& operator++() {
      if (!current_) epoch_->skip(batch_);
      current_.reset();
      ++batch_;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.batch_ >= it.epoch_->num_batches; }

   private:
    friend class DataLoader;
    iterator(std::shared_ptr<Epoch> epoch, std::int64_t batch) : epoch_(std::move(epoch)), batch_(batch) {}
    std::shared_ptr<Epoch> epoch_;
    std::int64_t batch_ = 0;
    mutable std::optional<batch_type> current_;
  };

 private:
  std::shared_ptr<const Core> core_;
  DataLoaderOptions options_;
  detail::SamplerFn sampler_;
  std::int64_t sampler_size_ = 0;
  std::optional<DistributedSampler> shard_;
  mutable detail::EpochCounter next_epoch_;
};

template <class D>
DataLoader(D) -> DataLoader<D, DefaultCollate>;
template <class D>
DataLoader(D, DataLoaderOptions) -> DataLoader<D, DefaultCollate>;
template <class D, class C>
  requires(!user_sampler<C>)
DataLoader(D, DataLoaderOptions, C) -> DataLoader<D, C>;
template <class D, user_sampler S>
DataLoader(D, DataLoaderOptions, S) -> DataLoader<D, DefaultCollate>;
template <class D, user_sampler S, class C>
DataLoader(D, DataLoaderOptions, S, C) -> DataLoader<D, C>;

/// An in-memory map-style dataset: sample i is Batch{inputs[i], targets[i]}; read a batch at a time.
class TensorDataset {
 public:
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  std::int64_t size() const { return inputs_.size(0); }
  Batch get(std::int64_t index) const;
  /// One index_select per tensor (a narrow, without a copy, when the indices are consecutive).
  Batch get_batch(std::span<const std::int64_t> indices) const;

 private:
  at::Tensor inputs_, targets_;
};

}  // namespace fulgur::data
