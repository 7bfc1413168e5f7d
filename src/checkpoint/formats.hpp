#pragma once
// The generic reader's side of checkpoint::Format (include/fulgur/checkpoint/format.hpp): walking a
// checkpoint for the parts a Format owns. Private to libfulgur.
#include <string>

#include "fulgur/checkpoint/format.hpp"

namespace fulgur::checkpoint::parts {

/// Every part of `checkpoint` (read from `folder`) opened by its Format, in place.
void open(StateDict& checkpoint, const std::string& folder);
/// A copy of `checkpoint` with every part inlined by its Format.
StateDict inlined(const StateDict& checkpoint);

}  // namespace fulgur::checkpoint::parts
