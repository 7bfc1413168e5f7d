// The non-template part of fulgur::data::DataLoader (include/fulgur/data/data_loader.hpp): the worker
// threads, the epoch's order, the per-sample generators, the error texts and TensorDataset.
#include "fulgur/data/data_loader.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/ParallelGuard.h>

#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

#include "fulgur/errors.hpp"
#include "src/data/tensor_pair.hpp"

namespace fulgur::data {

namespace detail {

// ---- the worker threads ------------------------------------------------------------------------
struct BatchPipeline::State {
  std::mutex mutex;
  std::condition_variable work_available;  // workers wait here: a slot freed, or stop
  std::condition_variable batch_made;      // the consumer waits here: a batch made (or its error)
  std::vector<std::int64_t> made;          // per slot: the batch it holds, or -1
  std::vector<std::exception_ptr> errors;  // per slot: what making its batch threw
  std::int64_t next = 0, end = 0;          // the next batch to start; one past the last
  std::int64_t released = 0;               // every batch before this one is taken
  bool stop = false;
  Produce produce;
  std::vector<std::thread> threads;

  void work(int worker) {
    // As Python's DataLoader gives each worker process one intra-op thread: the workers' tensor
    // operations run inline instead of queueing on the pool the training step uses. Loading never
    // records autograd history.
    c10::ParallelGuard serial(true);
    c10::AutoGradMode no_grad(false);
    std::unique_lock lock(mutex);
    for (;;) {
      work_available.wait(lock, [&] {
        return stop || (next < end && next < released + static_cast<std::int64_t>(made.size()));
      });
      if (stop) return;
      const std::int64_t batch = next++;
      const std::size_t slot = static_cast<std::size_t>(batch % static_cast<std::int64_t>(made.size()));
      lock.unlock();
      std::exception_ptr error;
      try {
        produce(batch, slot, worker);
      } catch (const Abandoned&) {
        return;
      } catch (...) {  // this batch's error, for the consumer when it reaches the batch; the others go on
        error = std::current_exception();
      }
      lock.lock();
      errors[slot] = error;
      made[slot] = batch;
      batch_made.notify_one();  // one consumer
    }
  }
};

BatchPipeline::BatchPipeline(int workers, std::size_t slots, std::int64_t first_batch, std::int64_t end_batch,
                             Produce produce)
    : state_(std::make_unique<State>()) {
  state_->made.assign(slots, -1);
  state_->errors.resize(slots);
  state_->next = state_->released = first_batch;
  state_->end = end_batch;
  state_->produce = std::move(produce);
  state_->threads.reserve(static_cast<std::size_t>(workers));
  try {
    for (int w = 0; w < workers; ++w) state_->threads.emplace_back([state = state_.get(), w] { state->work(w); });
  } catch (...) {  // a thread that cannot start: stop the ones that did before reporting it
    {
      std::lock_guard lock(state_->mutex);
      state_->stop = true;
    }
    state_->work_available.notify_all();
    for (auto& thread : state_->threads) thread.join();
    throw;
  }
}

BatchPipeline::~BatchPipeline() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_available.notify_all();
  for (auto& thread : state_->threads)
    if (thread.joinable()) thread.join();
  state_.reset();
}

std::size_t BatchPipeline::acquire(std::int64_t batch) {
  const std::size_t slot = static_cast<std::size_t>(batch % static_cast<std::int64_t>(state_->made.size()));
  std::unique_lock lock(state_->mutex);
  state_->batch_made.wait(lock, [&] { return state_->made[slot] == batch; });
  if (std::exception_ptr error = std::exchange(state_->errors[slot], nullptr)) {
    state_->made[slot] = -1;  // the failed batch is taken: its slot goes to the batch after
    state_->released = batch + 1;
    lock.unlock();
    state_->work_available.notify_one();
    std::rethrow_exception(error);
  }
  return slot;
}

void BatchPipeline::release(std::int64_t batch) {
  {
    std::lock_guard lock(state_->mutex);
    state_->made[static_cast<std::size_t>(batch % static_cast<std::int64_t>(state_->made.size()))] = -1;
    state_->released = batch + 1;
  }
  state_->work_available.notify_one();  // one slot is free: one worker can use it
}

// ---- the order of an epoch and the per-sample generators ------------------------------------------
namespace {
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

at::Generator sample_generator(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  const std::uint64_t mixed =
      splitmix64(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(epoch)) ^ static_cast<std::uint64_t>(index));
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

EpochOrder::EpochOrder(at::Tensor order, std::int64_t length)
    : indices(std::move(order)), size(length), data(indices.defined() ? indices.data_ptr<std::int64_t>() : nullptr) {}

EpochOrder epoch_order(std::int64_t dataset_size, const DataLoaderOptions& options,
                       const std::optional<DistributedSampler>& shard, const SamplerFn& sampler,
                       std::int64_t user_sampler_size, std::int64_t epoch) {
  at::Tensor base;  // the whole order before sharding; undefined = 0..n-1
  std::int64_t base_size = dataset_size;
  if (sampler) {
    std::vector<std::int64_t> indices = sampler(epoch);
    for (std::size_t i = 0; i < indices.size(); ++i)
      if (indices[i] < 0 || indices[i] >= dataset_size)
        throw DataError("DataLoader: the sampler's index " + std::to_string(indices[i]) + " (position " +
                        std::to_string(i) + " of epoch " + std::to_string(epoch) +
                        ") is outside the dataset, which has " + std::to_string(dataset_size) + " samples.");
    if (static_cast<std::int64_t>(indices.size()) != user_sampler_size)
      throw DataError("DataLoader: the sampler gave " + std::to_string(indices.size()) + " indices for epoch " +
                      std::to_string(epoch) + " but " + std::to_string(user_sampler_size) +
                      " for epoch 0; a sampler's epochs must have one length (the loader's size() depends on it).");
    base = at::tensor(at::ArrayRef<std::int64_t>(indices), at::kLong);
    base_size = user_sampler_size;
  } else if (options.shuffle && !shard) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed + static_cast<std::uint64_t>(epoch));
    base = at::randperm(dataset_size, generator, at::TensorOptions().dtype(at::kLong));
  }
  if (!shard) return {base, base_size};
  // The shard picks positions of the base order (Python's DistributedSampler, shuffling itself).
  at::Tensor positions = shard->indices(epoch);
  at::Tensor picked = base.defined() ? base.index_select(0, positions) : positions;
  return {picked.contiguous(), picked.size(0)};
}

std::int64_t user_sampler_length(const SamplerFn& sampler) { return static_cast<std::int64_t>(sampler(0).size()); }

void check_options(const DataLoaderOptions& options, std::int64_t dataset_size, bool has_user_sampler) {
  if (options.batch_size <= 0)
    throw MisconfigurationError("DataLoader: batch_size must be > 0, got " + std::to_string(options.batch_size) + ".");
  if (options.num_workers < 0)
    throw MisconfigurationError("DataLoader: num_workers must be >= 0 (0 makes batches on the calling thread), got " +
                                std::to_string(options.num_workers) + ".");
  if (options.prefetch_factor < 1)
    throw MisconfigurationError("DataLoader: prefetch_factor must be >= 1, got " +
                                std::to_string(options.prefetch_factor) + ".");
  if (dataset_size < 0)
    throw DataError("DataLoader: the dataset's size() is " + std::to_string(dataset_size) + "; it must be >= 0.");
  if (has_user_sampler && options.shuffle)
    throw MisconfigurationError(
        "DataLoader: a sampler and shuffle = true do not go together (the sampler decides the order); "
        "shuffle in the sampler and leave shuffle false.");
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(options.num_workers) > cores) {
    static std::once_flag once;
    std::call_once(once, [&] {
      std::cerr << "fulgur: DataLoader: num_workers = " << options.num_workers << " is more than the " << cores
                << " cores this machine has; the workers will share them (more than the cores rarely helps)."
                << std::endl;
    });
  }
  if (options.pin_memory && !pinned_memory_available()) {
    static std::once_flag once;
    std::call_once(once, [] {
      std::cerr << "fulgur: DataLoader: pin_memory = true, but there is no CUDA device here (or LibTorch was "
                   "built without CUDA): batches stay in pageable memory, which changes nothing on the CPU."
                << std::endl;
    });
  }
}

namespace {
std::string current_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
std::string where(int worker) {
  return worker < 0 ? "on the calling thread (num_workers = 0)" : "in worker " + std::to_string(worker);
}
}  // namespace

void raise_sample_failure(std::int64_t index, std::int64_t batch, int worker) {
  std::throw_with_nested(DataError("DataLoader: get(" + std::to_string(index) + ") failed, reading sample " +
                                   std::to_string(index) + " for batch " + std::to_string(batch) + " " +
                                   where(worker) + ": " + current_message()));
}

void raise_batch_failure(const char* step, std::int64_t batch, std::span<const std::int64_t> indices, int worker) {
  std::string samples;  // the dataset indices, so that "sample 2 of the batch" names a sample
  for (std::size_t j = 0; j < indices.size() && j < 8; ++j) samples += (j ? ", " : "") + std::to_string(indices[j]);
  if (indices.size() > 8) samples += ", ... (" + std::to_string(indices.size()) + " in all)";
  std::throw_with_nested(DataError("DataLoader: " + std::string(step) + " failed for batch " + std::to_string(batch) +
                                   " (dataset indices " + samples + ") " + where(worker) + ": " + current_message()));
}

void raise_negative_first_batch(std::int64_t first_batch) {
  throw MisconfigurationError("DataLoader: begin_at(" + std::to_string(first_batch) +
                              "): the first batch of an epoch is 0 or more.");
}

void raise_out_of_order(std::int64_t batch, std::int64_t next, std::int64_t num_batches) {
  if (batch >= num_batches)
    throw DataError("DataLoader: batch " + std::to_string(batch) + " was asked for, but the epoch has " +
                    std::to_string(num_batches) + " batches: an iterator at the end of the epoch was dereferenced.");
  throw DataError("DataLoader: batch " + std::to_string(batch) + " was asked for after batch " +
                  std::to_string(next - 1) +
                  " was taken: an epoch's batches are read once, in order (a copy of the iterator read or passed "
                  "over this one already).");
}

void check_shard(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw MisconfigurationError("DataLoader::shard(" + std::to_string(rank) + ", " + std::to_string(world_size) +
                                "): the rank must be in [0, world_size) and world_size >= 1.");
}

void say_batches_not_pinned() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::cerr << "fulgur: DataLoader: pin_memory = true, but its batches are of a type fulgur::data::map_tensors "
                 "does not walk (or gives back as another type), so they stay in pageable memory; declare "
                 "`template <class F> T fulgur_map_tensors(const T&, F&&)` next to the batch type to have them "
                 "pinned."
              << std::endl;
  });
}

std::string describe_loader(std::int64_t dataset_size, std::int64_t num_samples, const DataLoaderOptions& options,
                            const std::optional<DistributedSampler>& shard, bool user_sampler) {
  std::string out = "DataLoader over " + std::to_string(dataset_size) + " samples, batch_size " +
                    std::to_string(options.batch_size) + ", num_workers " + std::to_string(options.num_workers);
  if (options.drop_last) out += ", drop_last";
  if (options.shuffle) out += ", shuffled";
  if (user_sampler) out += ", a user sampler";
  if (shard)
    out += ", shard " + std::to_string(shard->options().rank) + " of " + std::to_string(shard->options().world_size) +
           " (" + std::to_string(num_samples) + " samples)";
  return out;
}

}  // namespace detail

// ---- TensorDataset --------------------------------------------------------------------------------
TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  detail::check_tensor_pair("TensorDataset", inputs_, targets_);
}

Batch TensorDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw DataError("TensorDataset: index " + std::to_string(index) + " is outside its " + std::to_string(size()) +
                    " samples.");
  return Batch{inputs_[index], targets_[index]};
}

Batch TensorDataset::get_batch(std::span<const std::int64_t> indices) const {
  const auto n = static_cast<std::int64_t>(indices.size());
  bool consecutive = true;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= size())
      throw DataError("TensorDataset: index " + std::to_string(indices[i]) + " is outside its " +
                      std::to_string(size()) + " samples.");
    consecutive = consecutive && indices[i] == indices[0] + static_cast<std::int64_t>(i);
  }
  if (n > 0 && consecutive) return Batch{inputs_.narrow(0, indices[0], n), targets_.narrow(0, indices[0], n)};
  // index_select reads the span's indices during the call: a view of them needs no copy.
  auto ids = at::from_blob(const_cast<std::int64_t*>(indices.data()), {n}, at::kLong);
  if (inputs_.device() != ids.device()) ids = ids.to(inputs_.device());
  if (detail::allocating_pinned() && inputs_.is_cpu() && targets_.is_cpu()) {  // DataLoader{.pin_memory}
    auto select_pinned = [&](const at::Tensor& from) {
      std::vector<std::int64_t> sizes(from.sizes().begin(), from.sizes().end());
      sizes[0] = n;
      at::Tensor out = detail::empty_for_batch(sizes, from.scalar_type());
      return at::index_select_out(out, from, 0, ids);
    };
    return Batch{select_pinned(inputs_), select_pinned(targets_)};
  }
  return Batch{inputs_.index_select(0, ids), targets_.index_select(0, ids)};
}

}  // namespace fulgur::data
