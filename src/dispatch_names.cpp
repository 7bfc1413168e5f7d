// fulgur::dispatch's message for a name no compiled combination has (include/fulgur/dispatch.hpp): which
// axis, what the program compiled, and the name that was probably meant.
#include <algorithm>
#include <cctype>
#include <span>
#include <string>
#include <string_view>

#include "fulgur/dispatch.hpp"
#include "src/detail/edit_distance.hpp"

namespace fulgur::detail {
namespace {

/// Names people bring from elsewhere (PyTorch's dtype names, AMP, Lightning's removed strategies), with
/// fulgur's name for the same thing and, where the spelling is ambiguous, the other reading.
struct ForeignName {
  std::string_view axis, given, meant, aside;
};
constexpr ForeignName kForeignNames[] = {
    {"precision", "fp16", "16-mixed", "('16-true' keeps the weights in float16 too.)"},
    {"precision", "float16", "16-mixed", "('16-true' keeps the weights in float16 too.)"},
    {"precision", "half", "16-mixed", "('16-true' keeps the weights in float16 too.)"},
    {"precision", "amp", "16-mixed", "(Or 'bf16-mixed'.)"},
    {"precision", "mixed", "16-mixed", "(Or 'bf16-mixed'.)"},
    {"precision", "bfloat16", "bf16-mixed", "('bf16-true' keeps the weights in bfloat16 too.)"},
    {"precision", "fp32", "32-true", ""},
    {"precision", "float32", "32-true", ""},
    {"precision", "float", "32-true", ""},
    {"precision", "full", "32-true", ""},
    {"precision", "fp64", "64-true", ""},
    {"precision", "float64", "64-true", ""},
    {"precision", "double", "64-true", ""},
    {"strategy", "ddp_spawn", "ddp", "(fulgur's launcher starts the other ranks as processes of this program.)"},
    {"strategy", "ddp_fork", "ddp", "(fulgur's launcher starts the other ranks as processes of this program.)"},
    {"strategy", "ddp_notebook", "ddp", "(fulgur's launcher starts the other ranks as processes of this program.)"},
    {"strategy", "dp", "ddp", ""},
    {"strategy", "deepspeed", "deepspeed_stage_2", "(Lightning's 'deepspeed' is stage 2.)"},
    {"strategy", "single", "single_device", ""},
};

/// The name as compared: lower case, '_', '-' and ' ' alike.
std::string folded(std::string_view name) {
  std::string out;
  for (char c : name) out += (c == '-' || c == ' ') ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

MeantName probably_meant(std::string_view axis, std::string_view given, std::span<const std::string_view> names) {
  const std::string mine = folded(given);
  for (const ForeignName& foreign : kForeignNames)
    if (foreign.axis == axis && foreign.given == mine) return {foreign.meant, foreign.aside};
  MeantName best;
  std::size_t fewest = 3;  // at most two edits, in under a third of the name: "tpu" is no misspelt "cpu"
  for (std::string_view name : names) {
    const std::string theirs = folded(name);
    const std::size_t edits = edit_distance(mine, theirs);
    if (edits < fewest && 3 * edits < std::max(mine.size(), theirs.size())) {  // 0: case or - and _ alone
      fewest = edits;
      best.name = name;
    }
  }
  return best;
}

std::string unknown_name(std::string_view axis, std::string_view given, std::string_view resolved,
                         const std::string& compiled, bool shipped, std::string_view aliases,
                         std::span<const std::string_view> names) {
  std::string text = std::string(axis) + " '" + std::string(given) + "'";
  if (resolved != given) text += " ('" + std::string(resolved) + "')";
  if (!shipped) {
    if (const MeantName meant = probably_meant(axis, given, names); meant.name.empty())
      text += " is unknown; the ";
    else
      text += " is unknown. Did you mean '" + std::string(meant.name) + "'?" +
              (meant.aside.empty() ? "" : " " + std::string(meant.aside)) + " The ";
    return text + std::string(axis) + " names it takes are " + compiled + std::string(aliases) + ".";
  }
  text += " is not among the combinations this program compiled; the " + std::string(axis) + " names it takes are " +
          compiled + std::string(aliases) + ". Add its policy to the Trainer types given to dispatch";
  if (axis == "strategy" && resolved != "single_device" && resolved != "ddp")
    text += " (the sharded strategies are fulgur::shipped_sharded_strategies)";
  return text + ".";
}

}  // namespace fulgur::detail
