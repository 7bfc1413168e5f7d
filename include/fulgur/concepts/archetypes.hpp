#pragma once
// Minimal types that satisfy exactly the accelerator and precision concepts and nothing more.
// The strategy concept calls a strategy's precision- and accelerator-taking members with these,
// so a strategy that quietly relies on a member outside the contracts is refused.
// Declarations only: archetypes exist in unevaluated contexts.
#include <string_view>
#include <vector>

namespace fulgur::archetypes {

struct scope_guard {
  scope_guard(const scope_guard&) = delete;
  ~scope_guard();
};

template <class V>
struct accelerator {
  static constexpr std::string_view name = "archetype";
  static constexpr typename V::device_type device_type{};
  static bool is_available();
  static int auto_device_count();
  static std::vector<int> parse_devices(int);
  static std::vector<int> parse_devices(std::string_view);
  static std::vector<typename V::device> get_parallel_devices(const std::vector<int>&);
  void setup_device(const typename V::device&);
  void teardown();
};

template <class V>
struct precision {
  static constexpr std::string_view name = "archetype";
  void convert_module(typename V::module&);
  scope_guard module_init_context();
  scope_guard tensor_init_context();
  scope_guard forward_context();
  typename V::tensor convert_input(const typename V::tensor&);
  typename V::batch convert_input(const typename V::batch&);
  typename V::tensor convert_output(const typename V::tensor&);
  void pre_backward(const typename V::tensor&, typename V::module&);
  void backward(const typename V::tensor&, typename V::module&);
  void post_backward(const typename V::tensor&, typename V::module&);
  void unscale_gradients(typename V::optimizer&);
  bool optimizer_step(typename V::optimizer&);
  std::vector<typename V::tensor> main_params(typename V::optimizer&);
  typename V::state_dict state_dict() const;
  void load_state_dict(const typename V::state_dict&);
  void teardown();
};

}  // namespace fulgur::archetypes
