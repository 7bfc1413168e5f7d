#pragma once
// Several evaluation loaders, for fit's validation, validate, test and predict (Lightning's list of
// val/test/predict dataloaders):
//
//   trainer.validate(model, fulgur::data::loaders(clean, noisy));   // any loader types, by reference
//   trainer.fit(model, train, {val_a, val_b});                      // loaders of one type, copied
//
// The loops run them one after another; dataloader_idx (0, 1, ...) reaches the steps and batch hooks
// (`validation_step(batch, batch_idx, dataloader_idx)`), and what a step logs is named
// "<name>/dataloader_idx_<i>", as in Lightning. Lvalues are held by reference, rvalues moved in.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgur::data {

namespace detail {
template <class L>
concept sized_loader = requires(L& l) { l.size(); };
template <class L>
std::optional<std::int64_t> loader_length(L& loader) {
  if constexpr (sized_loader<L>) return static_cast<std::int64_t>(loader.size());
  else return std::nullopt;
}
template <class L>
std::string loader_description(L& loader) {
  if constexpr (requires { loader.describe(); }) return loader.describe();
  else return "a loader";
}

/// What a set of loaders does as one, on top of its each(f) and count(): under DDP each loader that
/// can be sharded takes this rank's part (as a single loader would), set_epoch reaches each loader
/// that reshuffles, and describe names them all.
template <class Set>
class LoaderSetOperations {
 public:
  Set& shard(int rank, int world_size) {
    self().each([&](auto& l, std::int64_t) {
      if constexpr (requires { l.shard(rank, world_size); }) l.shard(rank, world_size);
    });
    return self();
  }
  Set& shard_without_repeats(int rank, int world_size) {
    self().each([&](auto& l, std::int64_t) {
      if constexpr (requires { l.shard_without_repeats(rank, world_size); }) l.shard_without_repeats(rank, world_size);
    });
    return self();
  }
  std::int64_t repeated_samples() {
    std::int64_t n = 0;
    self().each([&](auto& l, std::int64_t) {
      if constexpr (requires { l.repeated_samples(); }) n += l.repeated_samples();
    });
    return n;
  }
  void set_epoch(std::int64_t epoch) {
    self().each([&](auto& l, std::int64_t) {
      if constexpr (requires { l.set_epoch(epoch); }) l.set_epoch(epoch);
    });
  }
  std::string describe() {
    std::string out = std::to_string(self().count()) + " loaders:";
    self().each([&](auto& l, std::int64_t i) { out += " [" + std::to_string(i) + "] " + loader_description(l); });
    return out;
  }

 private:
  Set& self() { return static_cast<Set&>(*this); }
};
}  // namespace detail

/// Evaluation loaders of any types, run in order as dataloader_idx 0, 1, ...
template <class... Loaders>
class EvaluationLoaders : public detail::LoaderSetOperations<EvaluationLoaders<Loaders...>> {
  static_assert(sizeof...(Loaders) >= 1, "fulgur::data::loaders(): give it at least one loader.");

 public:
  static constexpr bool several_loaders = true;
  using loader_types = std::tuple<std::remove_reference_t<Loaders>...>;
  explicit EvaluationLoaders(Loaders&&... loaders) : loaders_(std::forward<Loaders>(loaders)...) {}

  static constexpr std::size_t count() { return sizeof...(Loaders); }
  /// f(loader, dataloader_idx) for each loader, in order.
  template <class F>
  void each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::get<I>(loaders_), static_cast<std::int64_t>(I)), ...);
    }(std::index_sequence_for<Loaders...>{});
  }
  /// The batches of every loader, when each can tell (the loops' total for progress and limits).
  std::int64_t size() const
    requires(detail::sized_loader<std::remove_reference_t<Loaders>> && ...)
  {
    return std::apply([](auto&... l) { return (static_cast<std::int64_t>(l.size()) + ...); }, loaders_);
  }
 private:
  std::tuple<Loaders...> loaders_;
};

/// Evaluation loaders of one type (a braced list given to fit/validate/test/predict), copied.
template <class Loader>
class EvaluationLoaderList : public detail::LoaderSetOperations<EvaluationLoaderList<Loader>> {
 public:
  static constexpr bool several_loaders = true;
  using loader_types = std::tuple<Loader>;
  explicit EvaluationLoaderList(std::initializer_list<Loader> loaders) : loaders_(loaders) {}
  explicit EvaluationLoaderList(std::vector<Loader> loaders) : loaders_(std::move(loaders)) {}

  std::size_t count() const { return loaders_.size(); }
  template <class F>
  void each(F&& f) {
    for (std::size_t i = 0; i < loaders_.size(); ++i) f(loaders_[i], static_cast<std::int64_t>(i));
  }
  std::int64_t size() const
    requires detail::sized_loader<const Loader>
  {
    std::int64_t total = 0;
    for (const auto& l : loaders_) total += static_cast<std::int64_t>(l.size());
    return total;
  }
 private:
  std::vector<Loader> loaders_;
};

/// Several evaluation loaders: lvalues by reference, rvalues moved in.
template <class... Loaders>
EvaluationLoaders<Loaders...> loaders(Loaders&&... loaders) {
  return EvaluationLoaders<Loaders...>(std::forward<Loaders>(loaders)...);
}

/// A set of evaluation loaders (dataloader_idx 0, 1, ...), as opposed to one loader.
template <class T>
concept several_loaders = requires { requires std::remove_cvref_t<T>::several_loaders; };

}  // namespace fulgur::data
