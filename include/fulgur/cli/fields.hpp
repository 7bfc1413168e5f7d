#pragma once
// Describing a config struct once, for fulgur::cli: each field's YAML key, its member and a one-line
// doc. The CLI reads the list to accept `--model.lr=3e-4`, check its type, print it in --help with its
// default, and write it back in the resolved config. Torch-free and YAML-free: a model's config header
// includes only this.
//
//   struct GPTConfig {
//     std::int64_t n_layer = 4;
//     double lr = 1e-3;
//     static constexpr auto fields() {
//       using fulgur::cli::field;
//       return std::tuple(field("n_layer", &GPTConfig::n_layer, "transformer blocks"),
//                         field("lr", &GPTConfig::lr, "peak learning rate"));
//     }
//   };
//
// A type you cannot edit is described by specializing fulgur::cli::describe<T> with the same static
// fields(). Why not Boost.Describe or Boost.PFR: neither carries a doc string, which --help needs; Describe
// needs Boost 1.77 (Debian 12's default Boost, which Hana comes from, is 1.74), and PFR reads field names
// only from Boost 1.84. A field list is one line per field either way.
#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <utility>

namespace fulgur::cli {

/// One described member: `name` is its YAML key.
template <class Owner, class T>
struct Field {
  using owner_type = Owner;
  using value_type = T;
  std::string_view name;
  T Owner::*member;
  std::string_view doc;
};

template <class Owner, class T>
constexpr Field<Owner, T> field(std::string_view name, T Owner::*member, std::string_view doc) {
  return {name, member, doc};
}

/// Where the CLI finds T's fields: T::fields() unless specialized.
template <class T>
struct describe {
  static constexpr auto fields()
    requires requires { T::fields(); }
  {
    return T::fields();
  }
};

template <class T>
concept described = requires { describe<T>::fields(); };

/// The names an enum takes in a config (specialize with a static constexpr `values` array of
/// {enumerator, name} pairs).
template <class E>
struct enum_names;

template <class E>
concept named_enum = requires { enum_names<E>::values; };

/// Calls f(field) for each described field of T, in order.
template <described T, class F>
constexpr void for_each_field(F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, describe<T>::fields());
}

}  // namespace fulgur::cli
