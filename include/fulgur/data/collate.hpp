#pragma once
// fulgur::data::default_collate: a batch from the samples of a map-style dataset, the way Python's
// torch.utils.data.default_collate builds one. The structure of a sample is kept and its leaves are
// stacked along a new first dimension:
//   tensor                         -> stacked tensor [B, ...] (every sample the same shape)
//   Batch{input, target}           -> Batch{stacked inputs, stacked targets}
//   torch::data::Example{data, t}  -> Example{stacked data, stacked targets}
//   bool / integer / floating      -> a 1-d tensor of kBool / kLong / kDouble (Python's rule)
//   std::string                    -> std::vector<std::string>
//   pair, tuple, array             -> the same, each element collated
//   map<string, T>, unordered_map  -> the same keys, each value collated (every sample the same keys)
//   vector<T> (a Python list)      -> vector of collated elements (every sample the same length)
// A user type teaches fulgur by an ADL overload found by name, next to the type:
//   MySample fulgur_collate(std::span<const MySample> samples);
// or the DataLoader takes a collate function of its own (DataLoader(dataset, options, collate)).
#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgur/data/apply.hpp"
#include "fulgur/data/batch.hpp"

namespace fulgur::data {

namespace detail {
/// at::stack with an error that names the first sample whose shape differs.
at::Tensor stack_samples(const std::vector<at::Tensor>& samples, const char* what);
/// A 1-d tensor of the samples' numbers (kBool, kLong or kDouble).
at::Tensor numbers_to_tensor(const std::vector<bool>& values);
at::Tensor numbers_to_tensor(const std::vector<std::int64_t>& values);
at::Tensor numbers_to_tensor(const std::vector<double>& values);
[[noreturn]] void raise_collate_mismatch(const std::string& what, std::size_t sample, std::size_t got,
                                         std::size_t expected);
[[noreturn]] void raise_collate_missing_key(const std::string& key, std::size_t sample);
[[noreturn]] void raise_collate_overflow(std::size_t sample);

struct not_collatable {};

/// The same kind of map (comparator, hash) with another mapped type.
template <class Map, class V>
struct rebind_map;
template <class K, class U, class C, class A, class V>
struct rebind_map<std::map<K, U, C, A>, V> {
  using type = std::map<K, V, C>;
};
template <class K, class U, class H, class E, class A, class V>
struct rebind_map<std::unordered_map<K, U, H, E, A>, V> {
  using type = std::unordered_map<K, V, H, E>;
};

template <class T>
concept user_collatable = requires(std::span<const T> samples) {
  { fulgur_collate(samples) };
};

template <class Sample, class Project>
auto collect(std::span<const Sample> samples, Project project) {
  std::vector<std::decay_t<decltype(project(samples.front()))>> out;
  out.reserve(samples.size());
  for (const auto& s : samples) out.push_back(project(s));
  return out;
}
}  // namespace detail

template <class Sample>
auto default_collate(std::span<const Sample> samples);

namespace detail {
/// One field of every sample, collated (a vector<bool> has no span: it goes straight to a tensor).
template <class Value>
auto collate_column(const std::vector<Value>& column) {
  if constexpr (std::is_same_v<Value, bool>) return numbers_to_tensor(column);
  else return default_collate(std::span<const Value>(column));
}
}  // namespace detail

/// Collates a span of samples into one batch (see the table above).
template <class Sample>
auto default_collate(std::span<const Sample> samples) {
  using T = std::remove_cv_t<Sample>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return detail::stack_samples(std::vector<at::Tensor>(samples.begin(), samples.end()), "tensor");
  } else if constexpr (std::is_same_v<T, Batch>) {
    return Batch{detail::stack_samples(detail::collect(samples, [](const Batch& b) { return b.input; }), "input"),
                 detail::stack_samples(detail::collect(samples, [](const Batch& b) { return b.target; }), "target")};
  } else if constexpr (detail::is_example<T>::value) {
    auto data = detail::collect(samples, [](const T& e) { return e.data; });
    auto target = detail::collect(samples, [](const T& e) { return e.target; });
    return T{detail::collate_column(data),
             detail::collate_column(target)};
  } else if constexpr (std::is_same_v<T, bool>) {
    return detail::numbers_to_tensor(std::vector<bool>(samples.begin(), samples.end()));
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t))
      for (std::size_t i = 0; i < samples.size(); ++i)
        if (samples[i] > static_cast<T>(INT64_MAX)) detail::raise_collate_overflow(i);
    return detail::numbers_to_tensor(
        detail::collect(samples, [](const T& v) { return static_cast<std::int64_t>(v); }));
  } else if constexpr (std::is_floating_point_v<T>) {
    return detail::numbers_to_tensor(detail::collect(samples, [](const T& v) { return static_cast<double>(v); }));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return std::vector<std::string>(samples.begin(), samples.end());
  } else if constexpr (detail::is_pair<T>::value) {
    auto first = detail::collect(samples, [](const T& p) { return p.first; });
    auto second = detail::collect(samples, [](const T& p) { return p.second; });
    return std::pair{detail::collate_column(first),
                     detail::collate_column(second)};
  } else if constexpr (detail::is_tuple<T>::value || detail::is_array<T>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto field = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
        auto column = detail::collect(samples, [](const T& t) { return std::get<J>(t); });
        return detail::collate_column(column);
      };
      if constexpr (detail::is_tuple<T>::value) return std::tuple{field(std::integral_constant<std::size_t, I>{})...};
      else return std::array{field(std::integral_constant<std::size_t, I>{})...};
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (detail::is_map<T>::value) {
    using Value = typename T::mapped_type;
    using Collated = decltype(detail::collate_column(std::vector<Value>()));
    typename detail::rebind_map<T, Collated>::type out;
    for (const auto& [key, unused] : samples.front()) {
      (void)unused;
      std::vector<Value> column;
      column.reserve(samples.size());
      for (std::size_t s = 0; s < samples.size(); ++s) {
        auto found = samples[s].find(key);
        if (found == samples[s].end()) {
          if constexpr (std::is_convertible_v<typename T::key_type, std::string>) detail::raise_collate_missing_key(key, s);
          else detail::raise_collate_missing_key("(a key of sample 0)", s);
        }
        column.push_back(found->second);
      }
      out.emplace(key, detail::collate_column(column));
    }
    for (std::size_t s = 1; s < samples.size(); ++s)
      if (samples[s].size() != samples.front().size())
        detail::raise_collate_mismatch("number of keys", s, samples[s].size(), samples.front().size());
    return out;
  } else if constexpr (detail::is_vector<T>::value) {
    using Element = typename T::value_type;
    const std::size_t length = samples.front().size();
    for (std::size_t s = 1; s < samples.size(); ++s)
      if (samples[s].size() != length) detail::raise_collate_mismatch("list length", s, samples[s].size(), length);
    std::vector<decltype(detail::collate_column(std::vector<Element>()))> out;
    out.reserve(length);
    for (std::size_t i = 0; i < length; ++i) {
      auto column = detail::collect(samples, [i](const T& v) { return static_cast<Element>(v[i]); });
      out.push_back(detail::collate_column(column));
    }
    return out;
  } else if constexpr (detail::user_collatable<T>) {
    return fulgur_collate(samples);
  } else {
    static_assert(detail::user_collatable<T>,
                  "fulgur::data::default_collate does not know this sample type: return tensors, Batch, "
                  "numbers, strings, pairs, tuples, arrays, vectors or maps of them from get(index), declare "
                  "`T fulgur_collate(std::span<const T>)` next to your type, or give the DataLoader a collate "
                  "function.");
    return detail::not_collatable{};  // a type, so that the static_assert is the one error
  }
}

/// default_collate as a function object (the DataLoader's default collate).
struct DefaultCollate {
  template <class Sample>
  auto operator()(std::span<const Sample> samples) const {
    return default_collate(samples);
  }
};

}  // namespace fulgur::data
