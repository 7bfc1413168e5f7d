#pragma once
// Counting the FLOPs of a step once, for ThroughputMonitor's flops_per_batch (Lightning's
// measure_flops, which uses torch.utils.flop_counter.FlopCounterMode). fulgur runs the step under
// LibTorch's Kineto profiler with FLOP counting (the profiler's with_flops) and sums what it counted.
//
// What Kineto counts: aten::mm, addmm, bmm, baddbmm (2·M·N·K each; forward and the backward's
// matmuls), aten::conv2d's forward, and aten::add/mul (one per element). measure_flops keeps the
// matmuls and convolutions, FlopCounterMode's scope, which for Linear layers and matmul-built
// attention equals it exactly (the unit tests compare). Not counted, where FlopCounterMode counts:
// a convolution's backward and fused attention (scaled_dot_product_attention): for those, give
// flops_per_batch yourself. On a small GPT (examples/gpt's block, CPU) the count is 0.99·6·N·tokens
// (N without the embeddings), FlopCounterMode's there too; the attention's 12·layers·width·context
// per token is in neither.
//
// The step runs for real, once: on small inputs, or on the device with the real batch. A profiler
// already running in the process (TorchProfiler) is refused: Kineto runs one at a time.
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace fulgur {

/// What a step's operators cost, by operator name ("aten::mm"), as Kineto counts them.
struct FlopCount {
  std::map<std::string, std::int64_t> by_operator;
  /// The matmuls and convolutions (FlopCounterMode's scope): what measure_flops returns.
  std::int64_t matmul = 0;
  /// Every operator Kineto counts (elementwise add and mul too).
  std::int64_t total = 0;
};

/// Runs `step` once under the profiler and counts its FLOPs.
FlopCount count_flops(const std::function<void()>& step);

/// The matmul and convolution FLOPs of one run of `step` (forward, and backward when the step runs it):
/// Lightning's measure_flops(model, forward_fn, loss_fn).
std::int64_t measure_flops(const std::function<void()>& step);

}  // namespace fulgur
