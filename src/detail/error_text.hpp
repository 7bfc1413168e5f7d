#pragma once
// Library-internal: a fulgur error's text wrapped into another message.
#include <string>

namespace fulgur::detail {

/// An error's text without its leading "fulgur: ", for a message that quotes it after its own prefix.
inline std::string without_fulgur_prefix(std::string text) {
  if (text.rfind("fulgur: ", 0) == 0) text.erase(0, 8);
  return text;
}

}  // namespace fulgur::detail
