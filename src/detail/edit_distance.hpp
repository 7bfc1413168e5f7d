#pragma once
// How far a typo is from a name, for the "did you mean" of fulgur::dispatch and fulgur::cli.
#include <cstddef>
#include <string_view>

namespace fulgur::detail {

/// Edits (insert, delete, replace, or swap two neighbours) that turn a into b.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace fulgur::detail
