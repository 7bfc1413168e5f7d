// One compile-fail case per compatibility rule (FULGUR_RULE_*), over stub policies: with
// FULGUR_COMPILE_FAIL the combination breaks the rule and must not compile, with the rule's
// message; without it, the compiling twin changes only the offending policy.
#include "../concepts/stub_policies.hpp"
#include "fulgur/compatibility.hpp"

using namespace stub;
#ifdef FULGUR_COMPILE_FAIL
inline constexpr bool broken = true;
#else
inline constexpr bool broken = false;
#endif
template <class Bad, class Good>
using pick = std::conditional_t<broken, Bad, Good>;

#if defined(FULGUR_RULE_NOT_AN_ACCELERATOR)
using A = pick<Precision, Accelerator>;
using S = Strategy;
using P = Precision;
#elif defined(FULGUR_RULE_NOT_A_STRATEGY)
using A = Accelerator;
using S = pick<Accelerator, Strategy>;
using P = Precision;
#elif defined(FULGUR_RULE_ARGUMENTS_OUT_OF_ORDER)
using A = Accelerator;
using S = pick<Precision, Strategy>;
using P = pick<Strategy, Precision>;
#elif defined(FULGUR_RULE_NOT_A_PRECISION)
using A = Accelerator;
using S = Strategy;
using P = pick<Strategy, Precision>;
#elif defined(FULGUR_RULE_STRATEGY_ACCELERATOR)
using A = pick<Accelerator, CudaAccelerator>;
using S = NcclLikeStrategy;
using P = Precision;
#elif defined(FULGUR_RULE_PRECISION_ACCELERATOR)
using A = pick<Accelerator, CudaAccelerator>;
using S = Strategy;
using P = CudaOnlyPrecision;
#elif defined(FULGUR_RULE_BF16_SCALER)
using A = Accelerator;
using S = Strategy;
using P = pick<Bf16MixedWithScaler, Bf16MixedNoScaler>;
#elif defined(FULGUR_RULE_STRATEGY_PRECISION)
using A = Accelerator;
using S = ShardingStrategy;
using P = pick<DoublePrecision, Precision>;
#else
#error "define one FULGUR_RULE_*"
#endif

static_assert(fulgur::assert_compatible<A, S, P, Vocabulary>());
