#pragma once
// Lightning's `devices` parsing rules, shared by the accelerators (implemented in src/).
#include <string>
#include <string_view>
#include <vector>

namespace fulgur::detail {

/// CPU: an int > 0 (or its decimal string) -> that many process slots; -1 or "auto" -> all, which is 1.
std::vector<int> parse_cpu_devices(int devices);
std::vector<int> parse_cpu_devices(std::string_view devices);

/// CUDA: n -> [0, n); -1 or "-1" or "auto" -> all; "1,3" -> [1, 3] (order kept; "3," -> [3]);
/// each id must be unique and present among `available` device ids.
std::vector<int> parse_cuda_devices(int devices, int available);
std::vector<int> parse_cuda_devices(std::string_view devices, int available);

/// Any indexed device type (accelerator_defaults): Lightning's rule, with `name` in the messages.
std::vector<int> parse_indexed_devices(int devices, int available, std::string_view name);
std::vector<int> parse_indexed_devices(std::string_view devices, int available, std::string_view name);

/// "['cpu', 'cuda']": the accelerators this machine can run, for error messages.
std::string available_accelerators_text();

}  // namespace fulgur::detail
