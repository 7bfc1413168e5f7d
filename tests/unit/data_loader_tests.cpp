// fulgur::data::DataLoader: collate, order, workers, determinism, faults, sharding, fit and resume.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <ranges>
#include <set>
#include <thread>

#include "fulgur/data/data_loader.hpp"
#include "unit/support.hpp"

using namespace fulgur;
using fulgur::data::Batch;
using fulgur::data::DataLoader;
using fulgur::data::TensorDataset;

namespace {

/// Sample i: a 4-vector of i's, target i; counts its reads and the threads that made them.
struct CountingDataset {
  std::int64_t n = 40;
  std::shared_ptr<std::atomic<std::int64_t>> reads = std::make_shared<std::atomic<std::int64_t>>(0);
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::set<std::thread::id>> threads = std::make_shared<std::set<std::thread::id>>();
  std::shared_ptr<std::vector<std::int64_t>> read_indices = std::make_shared<std::vector<std::int64_t>>();
  std::chrono::milliseconds delay{0};
  std::int64_t throw_at = -1;

  std::int64_t size() const { return n; }
  Batch get(std::int64_t i) const {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (i == throw_at) throw std::out_of_range("sample " + std::to_string(i) + " is corrupt");
    ++*reads;
    {
      std::lock_guard lock(*mutex);
      threads->insert(std::this_thread::get_id());
      read_indices->push_back(i);
    }
    return Batch{at::full({4}, static_cast<double>(i), at::kFloat), at::scalar_tensor(i, at::kLong)};
  }
};

/// An augmenting dataset: a random crop and flip drawn from the generator the loader hands over.
struct AugmentedDataset {
  at::Tensor images = at::arange(24 * 3 * 8 * 8, at::kFloat).reshape({24, 3, 8, 8});
  std::int64_t size() const { return images.size(0); }
  std::pair<at::Tensor, std::int64_t> get(std::int64_t i, at::Generator& generator) const {
    const auto offsets = at::randint(3, {2}, generator, at::kLong);
    auto crop = images[i].narrow(1, offsets[0].item<std::int64_t>(), 6).narrow(2, offsets[1].item<std::int64_t>(), 6);
    if (at::rand({1}, generator).item<double>() < 0.5) crop = crop.flip({2});
    return {crop + at::randn({3, 6, 6}, generator) * 0.1, i};
  }
};

template <class Loader>
std::vector<std::pair<at::Tensor, at::Tensor>> epoch_of(const Loader& loader) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& b : loader) {
    if constexpr (std::is_same_v<std::decay_t<decltype(b)>, Batch>) out.emplace_back(b.input, b.target);
    else out.emplace_back(b.first, b.second);
  }
  return out;
}

bool same_batches(const std::vector<std::pair<at::Tensor, at::Tensor>>& a,
                  const std::vector<std::pair<at::Tensor, at::Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!test::identical(a[i].first, b[i].first) || !test::identical(a[i].second, b[i].second)) return false;
  return true;
}

}  // namespace

TEST_CASE("data loader: default_collate keeps the structure and stacks the leaves as Python does", "[data][collate]") {
  using data::default_collate;
  std::vector<at::Tensor> tensors{at::ones({2, 3}), at::zeros({2, 3})};
  CHECK(default_collate(std::span<const at::Tensor>(tensors)).sizes() == at::IntArrayRef({2, 2, 3}));

  std::vector<std::tuple<at::Tensor, std::int64_t, double, bool, std::string>> rows{
      {at::ones({3}), 1, 0.5, true, "a"}, {at::zeros({3}), 2, 1.5, false, "b"}};
  auto [t, ints, doubles, bools, strings] = default_collate(std::span<const decltype(rows)::value_type>(rows));
  CHECK(t.sizes() == at::IntArrayRef({2, 3}));
  CHECK(ints.scalar_type() == at::kLong);
  CHECK(torch::equal(ints, at::tensor({1, 2}, at::kLong)));
  CHECK(doubles.scalar_type() == at::kDouble);  // Python: float -> float64
  CHECK(bools.scalar_type() == at::kBool);
  CHECK((strings == std::vector<std::string>{"a", "b"}));

  std::vector<std::map<std::string, at::Tensor>> maps{{{"x", at::ones({2})}, {"y", at::ones({1})}},
                                                      {{"x", at::zeros({2})}, {"y", at::zeros({1})}}};
  auto collated = default_collate(std::span<const std::map<std::string, at::Tensor>>(maps));
  CHECK(collated.at("x").sizes() == at::IntArrayRef({2, 2}));
  CHECK(collated.at("y").sizes() == at::IntArrayRef({2, 1}));

  std::vector<std::vector<at::Tensor>> lists{{at::ones({2}), at::ones({5})}, {at::zeros({2}), at::zeros({5})}};
  auto columns = default_collate(std::span<const std::vector<at::Tensor>>(lists));
  REQUIRE(columns.size() == 2);
  CHECK(columns[1].sizes() == at::IntArrayRef({2, 5}));

  std::vector<at::Tensor> ragged{at::ones({3}), at::ones({4})};
  CHECK_THAT(test::message_of<DataError>([&] { (void)default_collate(std::span<const at::Tensor>(ragged)); }),
             Catch::Contains("sample 1 is [4] Float but sample 0 is [3] Float"));
  std::vector<std::map<std::string, at::Tensor>> missing{{{"x", at::ones({2})}}, {{"z", at::ones({2})}}};
  CHECK_THAT(test::message_of<DataError>(
                 [&] { (void)default_collate(std::span<const std::map<std::string, at::Tensor>>(missing)); }),
             Catch::Contains("sample 1 of the batch has no key 'x'"));
}

TEST_CASE("data loader: sequential and shuffled orders, drop_last, size and a new order each epoch", "[data][loader]") {
  CountingDataset dataset{.n = 10};
  DataLoader sequential(dataset, {.batch_size = 4});
  CHECK(sequential.size() == 3);
  auto batches = epoch_of(sequential);
  REQUIRE(batches.size() == 3);
  CHECK(torch::equal(batches[0].second, at::arange(4, at::kLong)));
  CHECK(batches[2].second.size(0) == 2);  // the short last batch
  DataLoader dropping(dataset, {.batch_size = 4, .drop_last = true});
  CHECK(dropping.size() == 2);
  CHECK(epoch_of(dropping).size() == 2);

  // The shuffled order is TensorLoader's (randperm seeded with seed + epoch, Python's rule).
  auto [x, y] = test::classification_data(10);
  data::TensorLoader reference(x, y, {.batch_size = 4, .shuffle = true, .seed = 5});
  DataLoader shuffled(TensorDataset(x, y), {.batch_size = 4, .shuffle = true, .seed = 5});
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) CHECK(torch::equal(shuffled.order_for_epoch(epoch), reference.order_for_epoch(epoch)));
  CHECK(!torch::equal(shuffled.order_for_epoch(0), shuffled.order_for_epoch(1)));
  shuffled.set_epoch(2);
  reference.set_epoch(2);
  std::vector<std::pair<at::Tensor, at::Tensor>> expected;
  for (const auto& b : reference) expected.emplace_back(b.input, b.target);
  CHECK(same_batches(epoch_of(shuffled), expected));
}

TEST_CASE("data loader: batches are bit-identical for 0, 1, 2 and 4 workers, augmentations included", "[data][loader][workers]") {
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> runs;
  for (int workers : {0, 1, 2, 4}) {
    DataLoader loader(AugmentedDataset{}, {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 3});
    loader.set_epoch(1);
    runs.push_back(epoch_of(loader));
  }
  REQUIRE(runs[0].size() == 5);
  for (std::size_t r = 1; r < runs.size(); ++r) CHECK(same_batches(runs[0], runs[r]));
  // A sample's draws depend on (seed, epoch, index): another epoch or seed draws others.
  DataLoader other_epoch(AugmentedDataset{}, {.batch_size = 5, .num_workers = 2, .seed = 3});
  DataLoader same_epoch(AugmentedDataset{}, {.batch_size = 5, .num_workers = 0, .seed = 3});
  other_epoch.set_epoch(2);
  same_epoch.set_epoch(2);
  CHECK(same_batches(epoch_of(other_epoch), epoch_of(same_epoch)));
  same_epoch.set_epoch(3);
  other_epoch.set_epoch(2);
  CHECK(!same_batches(epoch_of(other_epoch), epoch_of(same_epoch)));
}

TEST_CASE("data loader: workers read on their own threads, at most prefetch_factor x num_workers batches ahead", "[data][loader][workers]") {
  CountingDataset dataset{.n = 64};
  {
    DataLoader loader(dataset, {.batch_size = 4, .num_workers = 0});
    (void)epoch_of(loader);
    CHECK((*dataset.threads == std::set<std::thread::id>{std::this_thread::get_id()}));
  }
  dataset.threads->clear();
  *dataset.reads = 0;
  DataLoader loader(dataset, {.batch_size = 4, .num_workers = 2, .prefetch_factor = 2});
  {
    auto it = loader.begin();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(*dataset.reads <= 2 * 2 * 4);  // the bound, whatever the timing
    CHECK(*dataset.reads > 0);           // and they started before being asked
    CHECK(torch::equal((*it).target, at::arange(4, at::kLong)));
  }
  (void)epoch_of(loader);
  CHECK(dataset.threads->count(std::this_thread::get_id()) == 0);
  CHECK(dataset.threads->size() <= 2);
}

TEST_CASE("data loader: an exception in get names the sample, the batch and the worker, and nothing hangs", "[data][loader][errors]") {
  for (int workers : {0, 2}) {
    CountingDataset dataset{.n = 32, .throw_at = 13};
    DataLoader loader(dataset, {.batch_size = 4, .num_workers = workers});
    std::vector<std::int64_t> seen;
    std::string message;
    try {
      for (const auto& b : loader) seen.push_back(b.target[0].item<std::int64_t>());
    } catch (const DataError& e) {
      message = e.what();
      CHECK_THROWS_AS(std::rethrow_if_nested(e), std::out_of_range);  // the original is nested
    }
    CHECK((seen == std::vector<std::int64_t>{0, 4, 8}));  // the batches before it came out, in order
    CHECK_THAT(message, Catch::Contains("get(13) failed") && Catch::Contains("batch 3") &&
                            Catch::Contains("sample 13 is corrupt"));
    CHECK_THAT(message, Catch::Contains(workers == 0 ? "calling thread" : "in worker"));
    // The loader is usable afterwards: the next epoch reads again (and fails again at 13).
    CHECK_THROWS_AS(epoch_of(loader), DataError);
  }
  // A collate that throws is reported too.
  auto bad_collate = [](std::span<const Batch>) -> Batch { throw std::runtime_error("no collating today"); };
  DataLoader loader(CountingDataset{.n = 8}, {.batch_size = 4, .num_workers = 1}, bad_collate);
  CHECK_THAT(test::message_of<DataError>([&] { (void)epoch_of(loader); }),
             Catch::Contains("collate failed for batch 0 (dataset indices 0, 1, 2, 3)") && Catch::Contains("no collating today"));
}

TEST_CASE("data loader: a loop that catches a sample's error goes on with the batches after it (probe regression)", "[data][loader][errors]") {
  for (int workers : {0, 2}) {
    CountingDataset dataset{.n = 24, .throw_at = 9};
    DataLoader loader(dataset, {.batch_size = 4, .num_workers = workers});
    std::vector<std::int64_t> seen;
    int errors = 0;
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      try {
        seen.push_back((*it).target[0].item<std::int64_t>());
      } catch (const DataError&) {
        ++errors;
        CHECK_THROWS_AS(*it, DataError);  // asked again: the same error, not a hang
      }
    }
    CHECK(errors == 1);
    CHECK((seen == std::vector<std::int64_t>{0, 4, 12, 16, 20}));
  }
}

TEST_CASE("data loader: iterators used out of order, begin_at, shard and batch_size edges are errors, not hangs (probe regressions)", "[data][loader][errors]") {
  for (int workers : {0, 2}) {
    DataLoader loader(CountingDataset{.n = 12}, {.batch_size = 2, .num_workers = workers});
    auto it = loader.begin();
    auto copy = it;
    ++it;
    ++it;  // batches 0 and 1 passed over unread
    ++copy;
    CHECK_THAT(test::message_of<DataError>([&] { (void)*copy; }), Catch::Contains("read once, in order"));
    CHECK(torch::equal((*it).target, at::tensor({4, 5}, at::kLong)));
    auto end = loader.begin();
    while (end != loader.end()) ++end;
    CHECK_THAT(test::message_of<DataError>([&] { (void)*end; }), Catch::Contains("at the end of the epoch"));
    CHECK_THROWS_AS(loader.begin_at(-1), MisconfigurationError);
    CHECK(loader.begin_at(99) == std::default_sentinel);
  }
  CHECK(DataLoader(CountingDataset{.n = 10}, {.batch_size = INT64_MAX}).size() == 1);
  CHECK(DataLoader(CountingDataset{.n = 10}, {.batch_size = INT64_MAX - 5}).size() == 1);
  DataLoader sharded(CountingDataset{.n = 10}, {.batch_size = 2});
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { sharded.shard(3, 2); }), Catch::Contains("shard(3, 2)"));
  // prefetch_factor far above the epoch's batches allocates no more slots than there are batches.
  DataLoader greedy(CountingDataset{.n = 10}, {.batch_size = 2, .num_workers = 2, .prefetch_factor = 1 << 30});
  CHECK(epoch_of(greedy).size() == 5);
}

TEST_CASE("data loader: samples without a target, maps with their comparator, unsigned numbers (probe regressions)", "[data][collate]") {
  struct Unlabelled {
    std::int64_t size() const { return 6; }
    Batch get(std::int64_t i) const { return Batch{at::full({3}, static_cast<double>(i))}; }
  };
  DataLoader loader(Unlabelled{}, {.batch_size = 4, .num_workers = 1});
  for (const auto& b : loader) {
    CHECK(b.input.size(1) == 3);
    CHECK(!b.target.defined());
  }
  std::vector<std::map<std::string, at::Tensor, std::less<>>> maps{{{"x", at::ones({2})}}, {{"x", at::zeros({2})}}};
  auto collated = data::default_collate(std::span<const std::map<std::string, at::Tensor, std::less<>>>(maps));
  static_assert(std::is_same_v<decltype(collated), std::map<std::string, at::Tensor, std::less<>>>);
  std::vector<std::uint64_t> big{1, UINT64_MAX};
  CHECK_THAT(test::message_of<DataError>([&] { (void)data::default_collate(std::span<const std::uint64_t>(big)); }),
             Catch::Contains("above INT64_MAX"));
  std::vector<Batch> half{Batch{at::ones({2}), at::ones({1})}, Batch{at::ones({2})}};
  CHECK_THAT(test::message_of<DataError>([&] { (void)data::default_collate(std::span<const Batch>(half)); }),
             Catch::Contains("every sample has it or none"));
}

TEST_CASE("data loader: leaving an epoch early joins its workers promptly", "[data][loader][workers]") {
  CountingDataset dataset{.n = 4000, .delay = std::chrono::milliseconds(2)};
  DataLoader loader(dataset, {.batch_size = 8, .num_workers = 2, .prefetch_factor = 4});
  const auto start = std::chrono::steady_clock::now();
  for (const auto& b : loader) {
    (void)b;
    break;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < std::chrono::seconds(5));  // a full epoch takes 4000 x 2 ms / 2 = 4 s of reading
  const std::int64_t reads = *dataset.reads;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(*dataset.reads == reads);  // nothing reads after the epoch is gone
  CHECK(reads < 400);
}

TEST_CASE("data loader: an epoch's iterator outlives its loader, two epochs run side by side", "[data][loader][workers]") {
  auto it = [] {
    DataLoader loader(CountingDataset{.n = 12}, {.batch_size = 4, .num_workers = 2});
    return loader.begin();
  }();  // the loader is gone; the epoch owns what it reads
  std::vector<std::int64_t> firsts;
  for (; it != std::default_sentinel; ++it) firsts.push_back((*it).target[0].item<std::int64_t>());
  CHECK((firsts == std::vector<std::int64_t>{0, 4, 8}));
  DataLoader loader(CountingDataset{.n = 8}, {.batch_size = 2, .num_workers = 2});
  std::int64_t pairs = 0;
  for (const auto& outer : loader)
    for (const auto& inner : loader) pairs += outer.target.size(0) * inner.target.size(0);
  CHECK(pairs == 64);
}

namespace sampler_ranges {
struct Iota {  // a view: begin/end as members, input iterators over int
  auto indices(std::int64_t) const { return std::views::iota(0, 6) | std::views::transform([](int i) { return 5 - i; }); }
};
struct Span {
  std::int64_t order[3] = {2, 0, 1};
  std::span<const std::int64_t> indices(std::int64_t) const { return order; }
};
struct Countdown {  // begin/end found by ADL only, as range-for finds them
  int n;
};
struct CountdownIterator {
  using difference_type = std::ptrdiff_t;
  using value_type = int;
  int i;
  int operator*() const { return i; }
  CountdownIterator& operator++() { --i; return *this; }
  void operator++(int) { --i; }
  bool operator==(const CountdownIterator&) const = default;
};
CountdownIterator begin(const Countdown& c) { return {c.n - 1}; }
CountdownIterator end(const Countdown&) { return {-1}; }
struct AdlOnly {
  Countdown indices(std::int64_t) const { return {4}; }
};
struct Doubles {
  std::vector<double> indices(std::int64_t) const { return {0.0}; }
};
struct NotARange {
  std::int64_t indices(std::int64_t) const { return 0; }
};
}  // namespace sampler_ranges

TEST_CASE("data loader: a user sampler is any range of integers range-for can walk", "[data][loader]") {
  using namespace sampler_ranges;
  STATIC_REQUIRE(data::user_sampler<Iota>);
  STATIC_REQUIRE(data::user_sampler<Span>);
  STATIC_REQUIRE(data::user_sampler<AdlOnly>);
  STATIC_REQUIRE_FALSE(data::user_sampler<Doubles>);
  STATIC_REQUIRE_FALSE(data::user_sampler<NotARange>);
  auto first_of_each_batch = [](auto loader) {
    std::vector<std::int64_t> firsts;
    for (const auto& [input, target] : epoch_of(loader)) firsts.push_back(target[0].template item<std::int64_t>());
    return firsts;
  };
  CHECK(first_of_each_batch(DataLoader(CountingDataset{.n = 6}, {.batch_size = 2}, Iota{})) ==
        std::vector<std::int64_t>{5, 3, 1});
  CHECK(first_of_each_batch(DataLoader(CountingDataset{.n = 6}, {.batch_size = 1}, AdlOnly{})) ==
        std::vector<std::int64_t>{3, 2, 1, 0});
}

TEST_CASE("data loader: shards, user samplers and options that cannot work", "[data][loader][errors]") {
  auto [x, y] = test::classification_data(10);
  std::vector<std::int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    DataLoader loader(TensorDataset(x, y), {.batch_size = 2, .shuffle = true, .seed = 1});
    data::TensorLoader reference(x, y, {.batch_size = 2, .shuffle = true, .seed = 1});
    loader.shard(rank, 3);
    reference.shard(rank, 3);
    CHECK(loader.size() == reference.size());
    CHECK(torch::equal(loader.order_for_epoch(4), reference.order_for_epoch(4)));
    auto order = loader.order_for_epoch(4);
    for (std::int64_t i = 0; i < order.size(0); ++i) all.push_back(order[i].item<std::int64_t>());
  }
  CHECK(std::set<std::int64_t>(all.begin(), all.end()).size() == 10);  // every sample (with Python's padding)

  struct EvenFirst {
    std::vector<std::int64_t> indices(std::int64_t epoch) const {
      std::vector<std::int64_t> out;
      for (std::int64_t i = 0; i < 10; i += 2) out.push_back((i + epoch) % 10);
      return out;
    }
  };
  DataLoader sampled(CountingDataset{.n = 10}, {.batch_size = 2}, EvenFirst{});
  CHECK(sampled.size() == 3);
  sampled.set_epoch(1);
  auto batches = epoch_of(sampled);
  CHECK(torch::equal(batches[0].second, at::tensor({1, 3}, at::kLong)));

  CHECK_THROWS_AS(DataLoader(CountingDataset{}, {.batch_size = 0}), MisconfigurationError);
  CHECK_THROWS_AS(data::TensorLoader(at::zeros({4, 2}), at::zeros({4}), {.batch_size = 0}), MisconfigurationError);
  CHECK_THROWS_AS(DataLoader(CountingDataset{}, {.num_workers = -1}), MisconfigurationError);
  CHECK_THROWS_AS(DataLoader(CountingDataset{}, {.prefetch_factor = 0}), MisconfigurationError);
  CHECK_THAT(test::message_of<MisconfigurationError>([] { DataLoader(CountingDataset{}, {.shuffle = true}, EvenFirst{}); }),
             Catch::Contains("shuffle"));
  struct OutOfRange {
    std::vector<int> indices(std::int64_t) const { return {0, 99}; }
  };
  DataLoader wrong(CountingDataset{.n = 10}, {}, OutOfRange{});
  CHECK_THAT(test::message_of<DataError>([&] { (void)epoch_of(wrong); }),
             Catch::Contains("index 99") && Catch::Contains("has 10 samples"));
  DataLoader empty(CountingDataset{.n = 0}, {.batch_size = 4, .num_workers = 2});
  CHECK(empty.size() == 0);
  CHECK(epoch_of(empty).empty());
}

TEST_CASE("data loader: fit with workers trains as fit with TensorLoader, bit for bit", "[data][loader][fit]") {
  auto [x, y] = test::classification_data(60, 2);
  auto [vx, vy] = test::classification_data(20, 3);
  auto train = [&](auto&& train_data, auto&& val_data) {
    torch::manual_seed(4);
    test::Classifier model;
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 3}));
    const auto result = trainer.fit(model, train_data, val_data);
    return std::pair{test::snapshot(*model), result.global_step};
  };
  const auto reference = train(data::TensorLoader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9}),
                               data::TensorLoader(vx, vy, {.batch_size = 8}));
  for (int workers : {0, 2}) {
    const auto loaded =
        train(DataLoader(TensorDataset(x, y), {.batch_size = 8, .shuffle = true, .num_workers = workers, .seed = 9}),
              DataLoader(TensorDataset(vx, vy), {.batch_size = 8, .num_workers = workers}));
    CHECK(loaded.second == reference.second);
    for (std::size_t i = 0; i < reference.first.size(); ++i) CHECK(test::identical(loaded.first[i], reference.first[i]));
  }
}

namespace {
/// A TensorDataset whose sample `fails_at` cannot be read.
struct FailingDataset {
  TensorDataset inner;
  std::int64_t fails_at;
  std::int64_t size() const { return inner.size(); }
  Batch get(std::int64_t i) const {
    if (i == fails_at) throw std::runtime_error("sample " + std::to_string(i) + " is corrupt");
    return inner.get(i);
  }
};
/// The classifier with a validation_step for several loaders.
struct TwoLoaderClassifierImpl : test::ClassifierImpl {
  at::Tensor validation_step(const Batch& b, std::int64_t i, std::int64_t) { return training_step(b, i); }
};
TORCH_MODULE(TwoLoaderClassifier);
}  // namespace

TEST_CASE("data loader: a sample that fails inside fit, validate or test names the loader, the batch and the stage (probe 8)", "[data][loader][errors][fit]") {
  using Catch::Contains;
  using Catch::StartsWith;
  auto [x, y] = test::classification_data(60, 2);
  auto [vx, vy] = test::classification_data(20, 3);
  auto failing = [](const at::Tensor& a, const at::Tensor& b, std::int64_t at, int workers) {
    return DataLoader(FailingDataset{TensorDataset(a, b), at}, {.batch_size = 8, .num_workers = workers});
  };
  auto good = [](const at::Tensor& a, const at::Tensor& b) { return DataLoader(TensorDataset(a, b), {.batch_size = 8}); };
  auto fit_error = [](auto module, auto&& train_data, auto&& val_data, TrainerConfig config = {}) {
    config.max_epochs = 2;
    test::CpuTrainer<FloatPrecision> trainer(test::quiet(config));
    return test::message_of<DataError>([&] { (void)trainer.fit(module, train_data, val_data); });
  };
  // Training: sample 45 is in batch 5 (batches of 8, in order); the loader's own text follows.
  for (int workers : {0, 2})
    CHECK_THAT(fit_error(test::Classifier(), failing(x, y, 45, workers), good(vx, vy)),
               StartsWith("fulgur: the training data failed making batch 5 of epoch 0: ") &&
                   Contains("get(45) failed") && Contains("sample 45 is corrupt"));
  // The sample's own exception stays nested, as the loader nests it.
  try {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
    test::Classifier model;
    auto train = failing(x, y, 3, 1);
    (void)trainer.fit(model, train);
    FAIL("fit went through a sample that cannot be read");
  } catch (const DataError& e) {
    std::string nested = "<nothing nested>";
    try {
      std::rethrow_if_nested(e);
    } catch (const DataError& inner) {
      nested = std::string("a DataError: ") + inner.what();  // the loader's own, nested once more
    } catch (const std::exception& inner) {
      nested = inner.what();
    }
    CHECK(nested == "sample 3 is corrupt");
  }
  // Validation: in the sanity check (sample 9 is in its second batch), then without one, in epoch 0.
  CHECK_THAT(fit_error(test::Classifier(), good(x, y), failing(vx, vy, 9, 1)),
             StartsWith("fulgur: the validation data failed making batch 1 of the sanity check: ") &&
                 Contains("sample 9 is corrupt"));
  CHECK_THAT(fit_error(test::Classifier(), good(x, y), failing(vx, vy, 9, 1), {.num_sanity_val_steps = 0}),
             StartsWith("fulgur: the validation data failed making batch 1 of the validation in epoch 0: "));
  // Several validation loaders: which one.
  CHECK_THAT(fit_error(TwoLoaderClassifier(), good(x, y), data::loaders(good(vx, vy), failing(vx, vy, 2, 0))),
             StartsWith("fulgur: the validation data (dataloader_idx 1) failed making batch 0 of the sanity check: "));
  // validate and test on their own.
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({}));
  test::Classifier model;
  auto broken = failing(vx, vy, 17, 0);
  CHECK_THAT(test::message_of<DataError>([&] { (void)trainer.validate(model, broken); }),
             StartsWith("fulgur: the validation data failed making batch 2 of validate(): "));
  CHECK_THAT(test::message_of<DataError>([&] { (void)trainer.test(model, broken); }),
             StartsWith("fulgur: the test data failed making batch 2 of test(): "));
}

TEST_CASE("data loader: a DataError thrown by a step itself is the step's, not put on the loader (probe 8)", "[data][loader][errors][fit]") {
  struct StepsThrowImpl : test::ClassifierImpl {
    at::Tensor training_step(const Batch&, std::int64_t) { throw DataError("training_step's own lookup failed"); }
    at::Tensor validation_step(const Batch&, std::int64_t) { throw DataError("validation_step's own lookup failed"); }
    at::Tensor predict_step(const Batch&, std::int64_t) { throw DataError("predict_step's own lookup failed"); }
  };
  auto [x, y] = test::classification_data(16, 2);
  auto module = std::make_shared<StepsThrowImpl>();
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  DataLoader loader(TensorDataset(x, y), {.batch_size = 8});
  CHECK(test::message_of<DataError>([&] { (void)trainer.fit(module, loader); }) == "training_step's own lookup failed");
  // The evaluation loops run the step inside their batch loop, next to the loader's calls.
  CHECK(test::message_of<DataError>([&] { (void)trainer.validate(module, loader); }) ==
        "validation_step's own lookup failed");
  CHECK(test::message_of<DataError>([&] { (void)trainer.predict(module, loader); }) == "predict_step's own lookup failed");
}

TEST_CASE("data loader: a fit resumed mid-epoch with workers continues the same batches without reading the skipped ones", "[data][loader][resume]") {
  const std::string folder = test::scratch_folder("data_loader_resume");
  auto [x, y] = test::classification_data(48, 5);
  struct Sampled {  // TensorDataset's samples, read one by one and counted
    at::Tensor x, y;
    std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
    std::shared_ptr<std::vector<std::int64_t>> read = std::make_shared<std::vector<std::int64_t>>();
    std::int64_t size() const { return x.size(0); }
    Batch get(std::int64_t i) const {
      std::lock_guard lock(*mutex);
      read->push_back(i);
      return Batch{x[i], y[i]};
    }
  };
  auto run = [&](std::int64_t max_steps, const std::string& ckpt, Sampled dataset) {
    torch::manual_seed(6);
    test::Classifier model;
    DataLoader loader(dataset, {.batch_size = 6, .shuffle = true, .num_workers = 2, .seed = 2});
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 2, .max_steps = max_steps}));
    trainer.fit(model, loader, FitOptions{.ckpt_path = ckpt});
    if (max_steps > 0) trainer.save_checkpoint(folder + "/mid.ckpt");
    return test::snapshot(*model);
  };
  const auto straight = run(-1, "", Sampled{x, y});
  (void)run(11, "", Sampled{x, y});  // 8 batches per epoch: stops after batch 3 of epoch 1
  Sampled resumed_data{x, y};
  const auto resumed = run(-1, folder + "/mid.ckpt", resumed_data);
  for (std::size_t i = 0; i < straight.size(); ++i) CHECK(test::identical(straight[i], resumed[i]));
  // The resumed run read epoch 1's batches 3..7 only: 5 x 6 samples, none of its first 18.
  DataLoader order(TensorDataset(x, y), {.batch_size = 6, .shuffle = true, .seed = 2});
  const auto epoch1 = order.order_for_epoch(1);
  std::multiset<std::int64_t> expected;
  for (std::int64_t i = 18; i < 48; ++i) expected.insert(epoch1[i].item<std::int64_t>());
  CHECK(std::multiset<std::int64_t>(resumed_data.read->begin(), resumed_data.read->end()) == expected);

  // Resumed with another batch size, the position means other samples (a new-user probe: it went on
  // silently): batch 3 of an epoch of 4 batches of 12 warns; of 3 batches of 16, it is past the end.
  auto resume_with = [&](std::int64_t batch_size) {
    test::Classifier model;
    DataLoader loader(TensorDataset(x, y), {.batch_size = batch_size, .shuffle = true, .seed = 2});
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 2}));
    return trainer.fit(model, loader, FitOptions{.ckpt_path = folder + "/mid.ckpt"});
  };
  const FitResult same = resume_with(6);
  CHECK(same.warnings.empty());
  const FitResult other = resume_with(12);
  CHECK(other.global_step == 12);  // epoch 1 goes on at batch 3, the last of its 4
  REQUIRE(other.warnings.size() == 1);
  CHECK_THAT(other.warnings.front(), Catch::Contains("taken after batch 2 of epoch 1, an epoch of 8 batches; this "
                                                     "run's has 4 (another batch size") &&
                                         Catch::Contains("samples are skipped or seen twice"));
  CHECK_THAT(test::message_of<CheckpointError>([&] { (void)resume_with(16); }),
             Catch::Contains("continues epoch 1 at batch 3, but the training data has only 3 batches"));
}

TEST_CASE("data loader: a token file read by workers gives the windows TokenDataset's get_batch makes", "[data][loader][files]") {
  const std::string folder = test::scratch_folder("data_loader_tokens");
  const std::string path = folder + "/train.bin";
  {
    std::vector<std::uint16_t> tokens(1000);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>((i * 7919) % 50000);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  data::TokenDataset tokens(path, {.context = 16});
  REQUIRE(tokens.size() == 62);  // (1000 - 1) / 16
  DataLoader loader(tokens, {.batch_size = 8, .shuffle = true, .drop_last = true, .num_workers = 2, .seed = 4});
  CHECK(loader.size() == 7);
  loader.set_epoch(3);
  const auto order = loader.order_for_epoch(3);
  std::int64_t b = 0;
  for (const auto& batch : loader) {
    std::vector<std::int64_t> indices(8);
    for (std::int64_t j = 0; j < 8; ++j) indices[static_cast<std::size_t>(j)] = order[b * 8 + j].item<std::int64_t>();
    const Batch expected = tokens.get_batch(indices);
    CHECK(torch::equal(batch.input, expected.input));
    CHECK(torch::equal(batch.target, expected.target));
    CHECK(torch::equal(batch.input.narrow(1, 1, 15), batch.target.narrow(1, 0, 15)));  // shifted by one
    ++b;
  }
  CHECK(b == 7);
}

namespace {
struct Opaque {  // a batch type map_tensors does not walk
  at::Tensor hidden;
};
struct OpaqueCollate {
  Opaque operator()(std::span<const Batch> samples) const { return {samples.front().input}; }
};
}  // namespace

TEST_CASE("data loader: pin_memory gives the pageable loader's batches, pinned exactly where CUDA can pin", "[data][loader][pinned]") {
  static_assert(data::tensor_traversable<std::pair<at::Tensor, std::int64_t>>);
  static_assert(data::tensor_traversable<std::map<std::string, std::vector<at::Tensor>>>);
  static_assert(data::tensor_traversable<torch::data::Example<>>);
  static_assert(!data::tensor_traversable<Opaque>);
  static_assert(!data::tensor_traversable<std::tuple<at::Tensor, Opaque>>);
  const bool pins = data::pinned_memory_available();  // false on a CPU-only machine: a no-op
  for (int workers : {0, 2}) {
    INFO("num_workers " << workers);
    AugmentedDataset augmented;
    DataLoader pinned(augmented, {.batch_size = 5, .shuffle = true, .num_workers = workers, .pin_memory = true});
    DataLoader pageable(augmented, {.batch_size = 5, .shuffle = true, .num_workers = workers});
    const auto a = epoch_of(pinned), b = epoch_of(pageable);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(test::identical(a[i].first, b[i].first));
      CHECK(test::identical(a[i].second, b[i].second));
      CHECK(data::is_pinned(a[i].first) == pins);
      CHECK(data::is_pinned(a[i].second) == pins);  // the numbers' tensor, pinned after collate
    }
    auto [x, y] = test::classification_data(30);
    DataLoader tensors(TensorDataset(x, y), {.batch_size = 8, .shuffle = true, .num_workers = workers, .pin_memory = true});
    for (const auto& batch : tensors) CHECK(data::is_pinned(batch.input) == pins);
  }
  const auto plain = at::ones({3});
  CHECK(data::pin_memory(plain).is_same(plain) == !pins);  // the tensor itself where nothing pins
  CHECK_FALSE(data::is_pinned(at::Tensor()));
  {
    data::detail::PinnedAllocationScope scope(true);
    CHECK(data::detail::allocating_pinned() == pins);
    CHECK(data::is_pinned(data::detail::empty_for_batch({2, 2}, at::kFloat)) == pins);
  }
  CHECK_FALSE(data::detail::allocating_pinned());
  // batches map_tensors cannot walk stay pageable, said once: the loader still works
  DataLoader opaque(CountingDataset{}, {.batch_size = 4, .pin_memory = true}, OpaqueCollate{});
  for (const auto& batch : opaque) CHECK_FALSE(data::is_pinned(batch.hidden));
}
