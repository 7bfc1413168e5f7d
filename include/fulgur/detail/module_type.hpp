#pragma once
// The module type a user names, whether the holder (Block, a TORCH_MODULE) or the module itself
// (BlockImpl): the policies that pick submodules by type (ActivationCheckpointing::by_type,
// WrapPolicy::by_type) compare against the module's own type, which typeid(*module) gives.

namespace fulgur::detail {

template <class M>
struct contained_module {
  using type = M;
};
template <class M>
  requires requires { typename M::ContainedType; }
struct contained_module<M> {
  using type = typename M::ContainedType;
};
/// BlockImpl for Block (a holder) and for BlockImpl itself.
template <class M>
using contained_t = typename contained_module<M>::type;

}  // namespace fulgur::detail
