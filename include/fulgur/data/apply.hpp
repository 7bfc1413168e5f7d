#pragma once
// map_tensors(x, f): a copy of x with every tensor t replaced by f(t), through any nesting of
// pairs, tuples, arrays, vectors, (unordered) maps, optionals, fulgur::data::Batch and
// torch::data::Example. Non-tensor leaves (numbers, strings) are copied as they are.
// A user type teaches fulgur its layout with an ADL overload found by name:
//   template <class F> MyBatch fulgur_map_tensors(const MyBatch&, F&& f);
#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <array>
#include <concepts>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgur/data/batch.hpp"

namespace fulgur::data {

template <class T>
struct is_tensor_leaf : std::bool_constant<std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                                           std::is_same_v<T, std::string>> {};

template <class T, class F>
auto map_tensors(const T& x, F&& f);

namespace detail {
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_map : std::false_type {};
template <class K, class V, class C, class A> struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... Ts> struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, std::size_t N> struct is_array<std::array<T, N>> : std::true_type {};
template <class T> struct is_example : std::false_type {};
template <class D, class L> struct is_example<torch::data::Example<D, L>> : std::true_type {};

template <class T, class F>
concept user_traversable = requires(const T& x, F& f) { fulgur_map_tensors(x, f); };
/// A function object map_tensors is instantiated with to ask whether it knows a type.
struct tensor_identity {
  at::Tensor operator()(const at::Tensor& t) const { return t; }
};
template <class T>
struct traversable : std::bool_constant<std::is_same_v<T, at::Tensor> || std::is_same_v<T, Batch> ||
                                        is_tensor_leaf<T>::value || user_traversable<T, tensor_identity>> {};
template <class A, class B>
struct traversable<std::pair<A, B>> : std::bool_constant<traversable<A>::value && traversable<B>::value> {};
template <class... Ts>
struct traversable<std::tuple<Ts...>> : std::bool_constant<(traversable<Ts>::value && ...)> {};
template <class T, std::size_t N>
struct traversable<std::array<T, N>> : traversable<T> {};
template <class T>
struct traversable<std::optional<T>> : traversable<T> {};
template <class T, class A>
struct traversable<std::vector<T, A>> : traversable<T> {};
template <class K, class V, class C, class A>
struct traversable<std::map<K, V, C, A>> : traversable<V> {};
template <class K, class V, class H, class E, class A>
struct traversable<std::unordered_map<K, V, H, E, A>> : traversable<V> {};
template <class D, class L>
struct traversable<torch::data::Example<D, L>> : std::bool_constant<traversable<D>::value && traversable<L>::value> {};
}  // namespace detail

/// A type map_tensors walks (and so batch_to_device moves): the ones listed above, nested.
template <class T>
concept tensor_traversable = detail::traversable<std::remove_cv_t<T>>::value;

template <class T, class F>
auto map_tensors(const T& x, F&& f) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return at::Tensor(f(x));
  } else if constexpr (std::is_same_v<T, Batch>) {
    return Batch{f(x.input), f(x.target)};
  } else if constexpr (is_tensor_leaf<T>::value) {
    return x;
  } else if constexpr (detail::is_example<T>::value) {
    return T{map_tensors(x.data, f), map_tensors(x.target, f)};
  } else if constexpr (detail::is_pair<T>::value) {
    return std::pair{map_tensors(x.first, f), map_tensors(x.second, f)};
  } else if constexpr (detail::is_tuple<T>::value) {
    return std::apply([&](const auto&... e) { return std::tuple{map_tensors(e, f)...}; }, x);
  } else if constexpr (detail::is_array<T>::value) {
    return std::apply([&](const auto&... e) { return std::array{map_tensors(e, f)...}; }, x);
  } else if constexpr (detail::is_optional<T>::value) {
    using U = decltype(map_tensors(*x, f));
    return x ? std::optional<U>(map_tensors(*x, f)) : std::optional<U>();
  } else if constexpr (detail::is_vector<T>::value) {
    std::vector<decltype(map_tensors(x.front(), f))> out;
    out.reserve(x.size());
    for (const auto& e : x) out.push_back(map_tensors(e, f));
    return out;
  } else if constexpr (detail::is_map<T>::value) {
    using K = typename T::key_type;
    using U = decltype(map_tensors(x.begin()->second, f));
    std::conditional_t<std::is_same_v<T, std::map<K, typename T::mapped_type>>, std::map<K, U>,
                       std::unordered_map<K, U>>
        out;
    for (const auto& [k, v] : x) out.emplace(k, map_tensors(v, f));
    return out;
  } else if constexpr (detail::user_traversable<T, F>) {
    return fulgur_map_tensors(x, f);
  } else {
    static_assert(detail::user_traversable<T, F>,
                  "fulgur::data::map_tensors does not know this batch type: use tensors, pairs, tuples, "
                  "arrays, vectors, maps, optionals, fulgur::data::Batch or torch::data::Example, or "
                  "declare `template <class F> T fulgur_map_tensors(const T&, F&&)` next to your type.");
  }
}

/// Calls f(t) for every tensor t in x, in traversal order.
template <class T, class F>
void for_each_tensor(const T& x, F&& f) {
  (void)map_tensors(x, [&](const at::Tensor& t) {
    f(t);
    return t;
  });
}

/// Lightning's batch-size rule: the first dimension of the first tensor found (1 for a 0-dim one).
template <class T>
std::int64_t extract_batch_size(const T& batch) {
  if constexpr (std::is_same_v<T, Batch>) {  // the common case, without walking the batch
    if (batch.input.defined()) return batch.input.dim() == 0 ? 1 : batch.input.size(0);
  }
  std::int64_t size = -1;
  for_each_tensor(batch, [&](const at::Tensor& t) {
    if (size < 0 && t.defined()) size = t.dim() == 0 ? 1 : t.size(0);
  });
  return size < 0 ? 1 : size;
}

}  // namespace fulgur::data
