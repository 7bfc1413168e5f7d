#pragma once
// The Trainer of a combination the rules refuse (included at the end of include/fulgur/trainer.hpp):
// every member accepts anything and does nothing, so that the one static_assert naming what is wrong
// is the only error a program using it sees.
#include <string>
#include <vector>

#include "fulgur/trainer.hpp"

namespace fulgur {

/// A combination the rules refuse: one static_assert names the member a policy lacks, or the broken
/// rule. Every member accepts anything, so the code that uses the Trainer adds no error of its own.
template <class A, class S, class P, class... Callbacks>
  requires(!compatible<A, S, P> || !(callback<Callbacks> && ...))
class Trainer<A, S, P, Callbacks...> {
  static_assert(detail::assert_trainer_arguments<A, S, P, Callbacks...>());

 public:
  using accelerator_type = A;
  using strategy_type = S;
  using precision_type = P;
  explicit Trainer(const TrainerConfig& = {}, const typename detail::strategy_options<S>::type& = {}) {}
  template <class... T>
  Trainer(const TrainerConfig&, T&&...) {}
  template <class... T> FitResult fit(T&&...) { return {}; }
  template <class... T> EvaluationResult validate(T&&...) { return {}; }
  template <class... T> EvaluationResult test(T&&...) { return {}; }
  template <class... T> std::vector<at::Tensor> predict(T&&...) { return {}; }  // the usual predictions' type
#define FULGUR_DETAIL_INERT(verb) \
  template <class... T>           \
  detail::inert verb(T&&...) {    \
    return {};                    \
  }
  FULGUR_DETAIL_INERT(setup)
  FULGUR_DETAIL_INERT(setup_module)
  FULGUR_DETAIL_INERT(setup_optimizers)
  FULGUR_DETAIL_INERT(setup_dataloader)
  FULGUR_DETAIL_INERT(init_module)
  FULGUR_DETAIL_INERT(init_tensor)
  FULGUR_DETAIL_INERT(batch_to_device)
  FULGUR_DETAIL_INERT(forward_context)
  FULGUR_DETAIL_INERT(convert_input)
  FULGUR_DETAIL_INERT(convert_output)
  FULGUR_DETAIL_INERT(convert_batch)
  FULGUR_DETAIL_INERT(end_training)
  FULGUR_DETAIL_INERT(remove_checkpoint)
  FULGUR_DETAIL_INERT(backward)
  FULGUR_DETAIL_INERT(unscale_gradients)
  FULGUR_DETAIL_INERT(unscales_in_optimizer)
  FULGUR_DETAIL_INERT(clip_gradients)
  FULGUR_DETAIL_INERT(optimizer_step)
  FULGUR_DETAIL_INERT(no_backward_sync)
  FULGUR_DETAIL_INERT(all_reduce)
  FULGUR_DETAIL_INERT(all_gather)
  FULGUR_DETAIL_INERT(broadcast)
  FULGUR_DETAIL_INERT(barrier)
  FULGUR_DETAIL_INERT(reduce_boolean_decision)
  FULGUR_DETAIL_INERT(is_global_zero)
  FULGUR_DETAIL_INERT(global_rank)
  FULGUR_DETAIL_INERT(local_rank)
  FULGUR_DETAIL_INERT(world_size)
  FULGUR_DETAIL_INERT(device)
  FULGUR_DETAIL_INERT(save)
  FULGUR_DETAIL_INERT(save_checkpoint)
  FULGUR_DETAIL_INERT(load)
  FULGUR_DETAIL_INERT(print)
  FULGUR_DETAIL_INERT(accelerator)
  FULGUR_DETAIL_INERT(strategy)
  FULGUR_DETAIL_INERT(precision)
  FULGUR_DETAIL_INERT(config)
  FULGUR_DETAIL_INERT(callbacks)
  template <class C>
  detail::inert callback() {
    return {};
  }
#undef FULGUR_DETAIL_INERT
  static std::string combination_name() { return {}; }
};

}  // namespace fulgur
