// Context "optimizer_config": the block is a synopsis of fulgur::OptimizerConfig
// (include/fulgur/optimization.hpp), declared in a namespace that sees fulgur's names. After it, a
// check that it is that struct: the same members, of the same types, and no other.
using fulgur::AnyLRScheduler;
using fulgur::SchedulerInterval;
// @block
#define FULGUR_DOCS_SAME_MEMBER(member)                                                                 \
  static_assert(std::is_same_v<decltype(OptimizerConfig::member), decltype(fulgur::OptimizerConfig::member)>, \
                "docs/concepts/training_module.md: OptimizerConfig::" #member " is not the library's");
FULGUR_DOCS_SAME_MEMBER(optimizer)
FULGUR_DOCS_SAME_MEMBER(lr_scheduler)
FULGUR_DOCS_SAME_MEMBER(interval)
FULGUR_DOCS_SAME_MEMBER(frequency)
FULGUR_DOCS_SAME_MEMBER(monitor)
FULGUR_DOCS_SAME_MEMBER(strict)
#undef FULGUR_DOCS_SAME_MEMBER
static_assert(sizeof(OptimizerConfig) == sizeof(fulgur::OptimizerConfig),
              "docs/concepts/training_module.md: OptimizerConfig has members the library's has not, or lacks some");
