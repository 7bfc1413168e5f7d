#pragma once
// fulgur::accelerator — where a run computes. Mirrors Lightning's Accelerator (setup_device,
// teardown, parse_devices, get_parallel_devices, auto_device_count, is_available, name).
// Torch-free: see vocabulary.hpp. The Trainer default-constructs its accelerator.
#include <concepts>
#include <string_view>
#include <vector>

#include "fulgur/concepts/requirements.hpp"
#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

// ---- one concept per member, named after it ------------------------------------------------
template <class A, class V>
concept accelerator_is_value_type = std::default_initializable<A> && std::movable<A>;
template <class A, class V>
concept accelerator_has_name = detail::has_policy_name<A>;
template <class A, class V>
concept accelerator_has_device_type = requires {
  { A::device_type } -> std::convertible_to<typename V::device_type>;
};
template <class A, class V>
concept accelerator_has_is_available = requires {
  { A::is_available() } -> std::same_as<bool>;
};
template <class A, class V>
concept accelerator_has_auto_device_count = requires {
  { A::auto_device_count() } -> std::convertible_to<int>;
};
template <class A, class V>
concept accelerator_has_parse_devices = requires(std::string_view spec, int count) {
  { A::parse_devices(count) } -> std::same_as<std::vector<int>>;
  { A::parse_devices(spec) } -> std::same_as<std::vector<int>>;
};
template <class A, class V>
concept accelerator_has_get_parallel_devices = requires(const std::vector<int>& ids) {
  { A::get_parallel_devices(ids) } -> std::same_as<std::vector<typename V::device>>;
};
template <class A, class V>
concept accelerator_has_setup_device = requires(A& a, const typename V::device& device) { a.setup_device(device); };
template <class A, class V>
concept accelerator_has_teardown = requires(A& a) { a.teardown(); };

// clang-format off
#define FULGUR_ACCELERATOR_REQUIREMENTS(R)                                                                   \
  R(accelerator_is_value_type, "a default constructor and a move constructor")                              \
  R(accelerator_has_name, "static constexpr std::string_view name")                                         \
  R(accelerator_has_device_type, "static constexpr c10::DeviceType device_type")                            \
  R(accelerator_has_is_available, "static bool is_available()")                                              \
  R(accelerator_has_auto_device_count, "static int auto_device_count()")                                     \
  R(accelerator_has_parse_devices, "static std::vector<int> parse_devices(int) and parse_devices(std::string_view)") \
  R(accelerator_has_get_parallel_devices, "static std::vector<c10::Device> get_parallel_devices(const std::vector<int>&)") \
  R(accelerator_has_setup_device, "void setup_device(const c10::Device&)")                                   \
  R(accelerator_has_teardown, "void teardown()")
// clang-format on

// ---- optional members: absent, or what fulgur calls them as ----------------------------------------
namespace detail::accelerator_members {
FULGUR_DETAIL_MEMBER_PROBE(supports_dtype)
}  // namespace detail::accelerator_members

/// Whether a device computes in a precision's dtype (the Trainer's constructor asks, docs/concepts/accelerator.md).
template <class A, class V>
concept accelerator_optional_supports_dtype =
    !detail::accelerator_members::has_member_supports_dtype<A>() ||
    requires(const typename V::device& device, typename V::scalar_type dtype) {
      { A::supports_dtype(device, dtype) } -> std::same_as<bool>;
    };

// clang-format off
#define FULGUR_ACCELERATOR_OPTIONAL_MEMBERS(R)                                                               \
  R(accelerator_optional_supports_dtype, "static bool supports_dtype(const c10::Device&, c10::ScalarType)")
// clang-format on

template <class T, class V>
concept accelerator_for =
    true FULGUR_ACCELERATOR_REQUIREMENTS(FULGUR_DETAIL_ALL_OF) FULGUR_ACCELERATOR_OPTIONAL_MEMBERS(FULGUR_DETAIL_ALL_OF);

/// An accelerator policy over LibTorch's types.
template <class A>
concept accelerator = accelerator_for<A, torch_vocabulary>;

namespace detail {
enum class accelerator_requirement {
  FULGUR_ACCELERATOR_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) FULGUR_ACCELERATOR_OPTIONAL_MEMBERS(FULGUR_DETAIL_ENUMERATE) none
};
template <class T, class V>
consteval accelerator_requirement first_missing_accelerator_requirement() {
  using Missing = accelerator_requirement;
  FULGUR_ACCELERATOR_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING)
  FULGUR_ACCELERATOR_OPTIONAL_MEMBERS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}
}  // namespace detail

/// One static_assert naming the first member the type lacks (the others stay silent).
template <class T, class V = torch_vocabulary>
consteval bool assert_accelerator() {
  using Missing = detail::accelerator_requirement;
  constexpr Missing missing = detail::first_missing_accelerator_requirement<T, V>();
#define FULGUR_DETAIL_LACKS "fulgur: the accelerator (Trainer's first argument) lacks `"
#define FULGUR_DETAIL_REMEDY \
  "`; write it, or derive from fulgur::accelerator_defaults<YourAccelerator> (docs/concepts/accelerator.md)."
  FULGUR_ACCELERATOR_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
#define FULGUR_DETAIL_LACKS "fulgur: the accelerator (Trainer's first argument) has a member named after the optional `"
#define FULGUR_DETAIL_REMEDY "`, but it cannot be called so; fix its signature (or rename it: fulgur would never call it)."
  FULGUR_ACCELERATOR_OPTIONAL_MEMBERS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
  return true;  // the one error is the static_assert above; a `false` here would add a second
}

}  // namespace fulgur
