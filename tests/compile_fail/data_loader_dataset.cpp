// A DataLoader over a type that misses what a map-style dataset needs (a const get; size() is
// checked the same way), or whose samples default_collate does not know: exactly one error, which
// names what is missing. The twin has it.
#include <fulgur/fulgur.hpp>

#include <optional>

#if defined(FULGUR_RULE_NO_GET)
struct Dataset {
  std::int64_t size() const { return 4; }
#ifdef FULGUR_COMPILE_FAIL
  at::Tensor get(std::int64_t i) { return at::full({2}, static_cast<double>(i)); }  // not const
#else
  at::Tensor get(std::int64_t i) const { return at::full({2}, static_cast<double>(i)); }
#endif
};
#elif defined(FULGUR_RULE_UNKNOWN_SAMPLE)
struct Dataset {
  std::int64_t size() const { return 4; }
#ifdef FULGUR_COMPILE_FAIL
  std::optional<at::Tensor> get(std::int64_t i) const { return at::full({2}, static_cast<double>(i)); }
#else
  at::Tensor get(std::int64_t i) const { return at::full({2}, static_cast<double>(i)); }
#endif
};
#endif

double read_all() {
  fulgur::data::DataLoader loader(Dataset{}, {.batch_size = 2, .num_workers = 1});
  double sum = 0;
  for (const auto& batch : loader) sum += static_cast<double>(sizeof(batch));
  return sum;
}
