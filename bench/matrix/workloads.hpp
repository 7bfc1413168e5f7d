#pragma once
// The three standard workloads of bench_matrix, one translation unit each (they build in parallel).
namespace fulgur::bench {
void register_mlp();  ///< tiny MLP 32-64-64-10, batch 64: overhead-bound
void register_cnn();  ///< small CNN on 3x32x32 images, batch 32
void register_gpt();  ///< small GPT (2 layers, d 64, 4 heads, causal SDPA), 8 x 64 tokens: compute-bound
}  // namespace fulgur::bench
