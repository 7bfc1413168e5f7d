#pragma once
// WrapPolicy: which submodules ShardedStrategy<3> gathers as one unit (FSDP's auto-wrap policy).
// A unit's parameters are whole on a rank only while its ops run; the parameters no unit holds
// form the root unit, whole from their first use until the end of backward.
//   WrapPolicy::by_type<BlockImpl>()        every submodule of that type (a transformer block)
//   WrapPolicy::by_size(1'000'000)          every submodule holding at least that many parameter
//                                           elements not in a unit inside it (FSDP's size_based_auto_wrap_policy)
// Both may be set; a submodule that either picks is a unit. Units are chosen innermost first.
#include <cstdint>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fulgur::distributed {

struct WrapPolicy {
  std::int64_t min_params = 0;                   ///< 0: no unit by size
  std::vector<std::type_index> module_types{};  ///< the submodules' own types (FooImpl; a holder Foo names it too)

  template <class... Modules>
  static WrapPolicy by_type(std::int64_t min_params = 0) {
    return {min_params, {std::type_index(typeid(contained_t<Modules>))...}};
  }
  static WrapPolicy by_size(std::int64_t min_params) { return {min_params, {}}; }

 private:
  template <class M>
  struct contained {
    using type = M;
  };
  template <class M>
    requires requires { typename M::ContainedType; }
  struct contained<M> {
    using type = typename M::ContainedType;
  };
  template <class M>
  using contained_t = typename contained<M>::type;
};

/// The units a policy makes of a module: each parameter's unit (by its TensorImpl; 0: the root)
/// and each unit's submodule name (names[u - 1]).
struct WrappedUnits {
  std::unordered_map<const void*, std::int64_t> unit_of;
  std::vector<std::string> names;
  std::int64_t of(const void* param) const {
    const auto it = unit_of.find(param);
    return it == unit_of.end() ? 0 : it->second;
  }
};
WrappedUnits wrap_units(const torch::nn::Module& root, const WrapPolicy& policy);

}  // namespace fulgur::distributed
