#pragma once
// fulgur::data::TokenDataset: a memory-mapped file of token ids, as windows for next-token prediction.
//
//   fulgur::data::TokenDataset train("train.bin", {.context = 1024, .dtype = fulgur::data::TokenDtype::uint16});
//   fulgur::data::Batch b = train.get(0);   // input: tokens[0, 1024), target: tokens[1, 1025), int64
//
// Two layouts are read. nanoGPT's .bin: the tokens and nothing else, little-endian uint16 (a
// vocabulary under 65536, e.g. GPT-2's) or uint32 as options.dtype says. llm.c's: 256 int32 header
// words ([0] magic, [1] version, [2] token count), then the tokens: 20240520 version 1 for GPT-2's uint16
// tokens, 20240801 version 7 for Llama 3's uint32 (llm.c's dev/data/data_common.py). A file that starts with
// either magic has its dtype decided by the header, whatever options.dtype says; dtype() reports it. (A headerless
// file cannot start with one by chance unless its first token is beyond GPT-2's or Llama 3's vocabulary.)
//
// Sample i is the window starting at token i * stride, its target shifted by one token. The default
// stride is the context: disjoint windows, size() = (num_tokens - 1) / context, an epoch reads each
// token once (what a validation set wants). A smaller stride makes overlapping windows — stride 1 is
// every position, and a shuffled epoch over them is nanoGPT's random windows, drawn without
// replacement. get and get_batch copy (the int64 conversion needs one), read only, and may be called
// from several threads at once.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "fulgur/data/batch.hpp"

namespace fulgur::data {

namespace detail {
class MappedFile;
}

enum class TokenDtype { uint16, uint32 };

struct TokenDatasetOptions {
  std::int64_t context = 256;             // tokens per sample
  TokenDtype dtype = TokenDtype::uint16;  // of a headerless file
  std::int64_t stride = 0;                // tokens between window starts; 0: context (disjoint windows)
};

class TokenDataset {
 public:
  /// Maps and checks `path`; a DataError naming the file, what is wrong and what to do otherwise.
  explicit TokenDataset(std::string path, TokenDatasetOptions options = {});

  /// The number of windows: (num_tokens() - 1 - context()) / stride() + 1.
  std::int64_t size() const { return (num_tokens_ - 1 - context_) / stride_ + 1; }
  /// Window `index`: {input, target}, int64 tensors of shape {context}, target = input shifted by one.
  Batch get(std::int64_t index) const;
  /// Windows `indices` stacked: {input, target} of shape {indices.size(), context}, one allocation
  /// each (what the DataLoader calls instead of get when a dataset has it).
  Batch get_batch(std::span<const std::int64_t> indices) const;

  std::int64_t num_tokens() const { return num_tokens_; }
  TokenDtype dtype() const { return dtype_; }
  std::int64_t context() const { return context_; }
  std::int64_t stride() const { return stride_; }
  const std::string& path() const { return path_; }
  /// True when the file has llm.c's 256-word header.
  bool has_llmc_header() const { return tokens_offset_ != 0; }

 private:
  void check_index(std::int64_t index) const;

  std::string path_;
  std::shared_ptr<const detail::MappedFile> file_;
  std::int64_t context_ = 0, stride_ = 0;
  TokenDtype dtype_ = TokenDtype::uint16;
  std::int64_t tokens_offset_ = 0;  // bytes before the first token
  std::int64_t num_tokens_ = 0;
};

}  // namespace fulgur::data
