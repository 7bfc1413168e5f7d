// compatible<A, S, P> and compatibility_reason over stub policies: every rule, both ways.
#include <catch2/catch.hpp>

#include "fulgur/compatibility.hpp"
#include "stub_policies.hpp"

using V = stub::Vocabulary;
using namespace stub;

template <class A, class S, class P>
constexpr bool ok = fulgur::compatible_for<A, S, P, V>;
template <class A, class S, class P>
constexpr std::string_view why = fulgur::compatibility_reason<A, S, P, V>();

TEST_CASE("compatible: the rules Lightning's connector checks, decided at compile time", "[compatibility]") {
  STATIC_REQUIRE(ok<Accelerator, Strategy, Precision>);
  STATIC_REQUIRE(why<Accelerator, Strategy, Precision>.empty());

  // Not a policy at all.
  STATIC_REQUIRE_FALSE(ok<int, Strategy, Precision>);
  STATIC_REQUIRE_FALSE(ok<Accelerator, int, Precision>);
  STATIC_REQUIRE_FALSE(ok<Accelerator, Strategy, int>);
  STATIC_REQUIRE(why<int, Strategy, Precision> == FULGUR_MSG_NOT_AN_ACCELERATOR);
  STATIC_REQUIRE(why<Accelerator, int, Precision> == FULGUR_MSG_NOT_A_STRATEGY);
  STATIC_REQUIRE(why<Accelerator, Strategy, int> == FULGUR_MSG_NOT_A_PRECISION);

  // The three policies in another order: one sentence on the order, whichever two are swapped, rather than
  // the member the misplaced type lacks.
  STATIC_REQUIRE_FALSE(ok<Accelerator, Precision, Strategy>);
  STATIC_REQUIRE(why<Accelerator, Precision, Strategy> == FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE(why<Strategy, Accelerator, Precision> == FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE(why<Strategy, Precision, Accelerator> == FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE(why<Precision, Accelerator, Strategy> == FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE(why<Precision, Strategy, Accelerator> == FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  // Not a permutation of the three (a policy twice): the member the misplaced one lacks, as before.
  STATIC_REQUIRE(why<Accelerator, Accelerator, Precision> == FULGUR_MSG_NOT_A_STRATEGY);
  STATIC_REQUIRE(why<Precision, Strategy, Precision> == FULGUR_MSG_NOT_AN_ACCELERATOR);

  // A backend that carries CUDA tensors only (NCCL) needs the CUDA accelerator.
  STATIC_REQUIRE_FALSE(ok<Accelerator, NcclLikeStrategy, Precision>);
  STATIC_REQUIRE(ok<CudaAccelerator, NcclLikeStrategy, Precision>);
  STATIC_REQUIRE(why<Accelerator, NcclLikeStrategy, Precision> == FULGUR_MSG_STRATEGY_ACCELERATOR);

  // A precision that runs on some accelerators only.
  STATIC_REQUIRE_FALSE(ok<Accelerator, Strategy, CudaOnlyPrecision>);
  STATIC_REQUIRE(ok<CudaAccelerator, Strategy, CudaOnlyPrecision>);
  STATIC_REQUIRE(why<Accelerator, Strategy, CudaOnlyPrecision> == FULGUR_MSG_PRECISION_ACCELERATOR);

  // bf16-mixed refuses a scaler; 16-mixed takes one; bf16-mixed without one is fine.
  STATIC_REQUIRE_FALSE(ok<Accelerator, Strategy, Bf16MixedWithScaler>);
  STATIC_REQUIRE(ok<Accelerator, Strategy, Bf16MixedNoScaler>);
  STATIC_REQUIRE(ok<Accelerator, Strategy, Fp16MixedWithScaler>);
  STATIC_REQUIRE(why<Accelerator, Strategy, Bf16MixedWithScaler> == FULGUR_MSG_BF16_SCALER);

  // Sharding refuses 64-true, as FSDP and DeepSpeed do.
  STATIC_REQUIRE_FALSE(ok<Accelerator, ShardingStrategy, DoublePrecision>);
  STATIC_REQUIRE(ok<Accelerator, ShardingStrategy, Precision>);
  STATIC_REQUIRE(ok<Accelerator, Strategy, DoublePrecision>);
  STATIC_REQUIRE(why<Accelerator, ShardingStrategy, DoublePrecision> == FULGUR_MSG_STRATEGY_PRECISION);

  // The first broken rule is reported (accelerator before strategy before precision...).
  STATIC_REQUIRE(why<int, int, int> == FULGUR_MSG_NOT_AN_ACCELERATOR);
  STATIC_REQUIRE(why<Accelerator, NcclLikeStrategy, Bf16MixedWithScaler> == FULGUR_MSG_STRATEGY_ACCELERATOR);
}
