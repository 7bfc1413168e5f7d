// The registry of checkpoint::Format and the walk over a checkpoint's parts (src/checkpoint/formats.hpp).
#include "src/checkpoint/formats.hpp"

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <mutex>

namespace fulgur::checkpoint {
namespace {

std::mutex& added_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<const Format*>& added() {
  static std::vector<const Format*> formats;
  return formats;
}

/// `value` with each part replaced by what `change` makes of it (a part is not looked into).
template <class Change>
c10::IValue with_parts(const c10::IValue& value, const std::vector<const Format*>& known, const Change& change) {
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    const StateDict as_state(dict);
    for (const Format* format : known)
      if (format->owns(as_state)) return change(*format, as_state).to_ivalue();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict) out.insert(item.key(), with_parts(item.value(), known, change));
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (std::size_t i = 0; i < list.size(); ++i) out.push_back(with_parts(list.get(i), known, change));
    return out;
  }
  return value;
}

}  // namespace

std::vector<const Format*> formats() {
  std::vector<const Format*> all = fulgur::detail::shipped_checkpoint_formats();
  const std::lock_guard<std::mutex> lock(added_mutex());
  all.insert(all.end(), added().begin(), added().end());
  return all;
}

void add_format(const Format& format) {
  const std::lock_guard<std::mutex> lock(added_mutex());
  if (std::find(added().begin(), added().end(), &format) == added().end()) added().push_back(&format);
}

const Format* format_of(const StateDict& part) {
  for (const Format* format : formats())
    if (format->owns(part)) return format;
  return nullptr;
}

namespace parts {

void open(StateDict& checkpoint, const std::string& folder) {
  const auto known = formats();
  if (known.empty()) return;
  checkpoint = StateDict(with_parts(checkpoint.to_ivalue(), known, [&](const Format& format, const StateDict& part) {
                           return format.opened(part, folder);
                         }).toGenericDict());
}

StateDict inlined(const StateDict& checkpoint) {
  return StateDict(with_parts(checkpoint.to_ivalue(), formats(), [](const Format& format, const StateDict& part) {
                     return format.inlined(part);
                   }).toGenericDict());
}

}  // namespace parts
}  // namespace fulgur::checkpoint
