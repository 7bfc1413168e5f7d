// The non-template part of fulgur::data::default_collate (include/fulgur/data/collate.hpp).
#include "fulgur/data/collate.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "fulgur/data/pinned_memory.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::data::detail {

namespace {
std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << ' ' << t.scalar_type();
  return out.str();
}
}  // namespace

at::Tensor stack_samples(const std::vector<at::Tensor>& samples, const char* what) {
  if (samples.empty()) throw DataError("collate: no samples to stack.");
  // A member no sample has (a Batch without target, for predict) stays undefined in the batch.
  if (std::none_of(samples.begin(), samples.end(), [](const at::Tensor& t) { return t.defined(); })) return {};
  const at::Tensor& first = samples.front();
  for (std::size_t s = 0; s < samples.size(); ++s) {
    const at::Tensor& t = samples[s];
    if (!t.defined())
      throw DataError(std::string("collate: the ") + what + " of sample " + std::to_string(s) +
                      " of the batch is an undefined tensor but other samples have one; every sample has it or none.");
    if (s > 0 && (t.sizes() != first.sizes() || t.scalar_type() != first.scalar_type()))
      throw DataError(std::string("collate: cannot stack the ") + what + " of the batch's samples: sample " +
                      std::to_string(s) + " is " + shape_of(t) + " but sample 0 is " + shape_of(first) +
                      "; make every sample the same shape and dtype (crop or pad in get), or give the DataLoader a "
                      "collate function.");
  }
  if (!allocating_pinned()) return at::stack(samples);
  // Straight into a page-locked buffer (DataLoader{.pin_memory}): no second copy to pin it.
  std::vector<std::int64_t> sizes{static_cast<std::int64_t>(samples.size())};
  sizes.insert(sizes.end(), first.sizes().begin(), first.sizes().end());
  at::Tensor out = empty_for_batch(sizes, first.scalar_type());
  return at::stack_out(out, samples);
}

at::Tensor numbers_to_tensor(const std::vector<bool>& values) {
  auto out = at::empty({static_cast<std::int64_t>(values.size())}, at::kBool);
  auto* data = out.data_ptr<bool>();
  for (std::size_t i = 0; i < values.size(); ++i) data[i] = values[i];
  return out;
}

at::Tensor numbers_to_tensor(const std::vector<std::int64_t>& values) {
  return at::tensor(at::ArrayRef<std::int64_t>(values), at::kLong);
}

at::Tensor numbers_to_tensor(const std::vector<double>& values) {
  return at::tensor(at::ArrayRef<double>(values), at::kDouble);
}

void raise_collate_mismatch(const std::string& what, std::size_t sample, std::size_t got, std::size_t expected) {
  throw DataError("collate: sample " + std::to_string(sample) + " of the batch has " + what + " " +
                  std::to_string(got) + " but sample 0 has " + std::to_string(expected) +
                  "; every sample of a batch must have the same structure (or give the DataLoader a collate "
                  "function).");
}

void raise_collate_overflow(std::size_t sample) {
  throw DataError("collate: sample " + std::to_string(sample) +
                  " of the batch is an unsigned number above INT64_MAX, which a kLong tensor cannot hold; return it "
                  "as a tensor of your choice instead.");
}

void raise_collate_missing_key(const std::string& key, std::size_t sample) {
  throw DataError("collate: sample " + std::to_string(sample) + " of the batch has no key '" + key +
                  "' that sample 0 has; every sample of a batch must have the same keys.");
}

}  // namespace fulgur::data::detail
