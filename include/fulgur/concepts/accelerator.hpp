#pragma once
// fulgur::accelerator — where a run computes. Mirrors Lightning's Accelerator
// (setup_device, teardown, parse_devices, get_parallel_devices, auto_device_count,
// is_available, name). Torch-free: see vocabulary.hpp.
#include <concepts>
#include <string_view>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

namespace detail {
template <class T>
concept has_policy_name = requires {
  { T::name } -> std::convertible_to<std::string_view>;
};
}  // namespace detail

/// Requirement fragments are named so that a failed check names the missing member.
template <class A, class V>
concept accelerator_identity_for = detail::has_policy_name<A> && requires {
  { A::device_type } -> std::convertible_to<typename V::device_type>;
};

template <class A, class V>
concept accelerator_discovery_for = requires(std::string_view devices_spec, int devices_count,
                                             const std::vector<int>& device_ids) {
  { A::is_available() } -> std::same_as<bool>;
  { A::auto_device_count() } -> std::convertible_to<int>;
  { A::parse_devices(devices_count) } -> std::same_as<std::vector<int>>;
  { A::parse_devices(devices_spec) } -> std::same_as<std::vector<int>>;
  { A::get_parallel_devices(device_ids) } -> std::same_as<std::vector<typename V::device>>;
};

template <class A, class V>
concept accelerator_lifecycle_for = requires(A& accelerator, const typename V::device& device) {
  accelerator.setup_device(device);
  accelerator.teardown();
};

template <class A, class V>
concept accelerator_for = std::movable<A> && accelerator_identity_for<A, V> &&
                          accelerator_discovery_for<A, V> && accelerator_lifecycle_for<A, V>;

/// An accelerator policy over LibTorch's types.
template <class A>
concept accelerator = accelerator_for<A, torch_vocabulary>;

}  // namespace fulgur
