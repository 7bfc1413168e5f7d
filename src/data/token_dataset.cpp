// fulgur::data::TokenDataset (include/fulgur/data/token_dataset.hpp).
#include "fulgur/data/token_dataset.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>

#include "fulgur/errors.hpp"
#include "src/data/mapped_file.hpp"

namespace fulgur::data {
namespace {

// llm.c's dev/data/data_common.py (HEADERS_INFO): 256 int32 words, then the tokens. Each model's
// format has its own magic and version: GPT-2's uint16 tokens, Llama 3's uint32.
struct LlmcFormat {
  std::int32_t magic, version;
  TokenDtype dtype;
  const char* model;
};
constexpr LlmcFormat kLlmcFormats[] = {{20240520, 1, TokenDtype::uint16, "gpt-2"},
                                       {20240801, 7, TokenDtype::uint32, "llama-3"}};
constexpr std::int64_t kLlmcHeaderBytes = 256 * sizeof(std::int32_t);

/// "magic 20240520 version 1 (gpt-2, uint16 tokens), magic 20240801 version 7 (llama-3, uint32 tokens)"
std::string llmc_formats_text() {
  std::string text;
  for (const LlmcFormat& f : kLlmcFormats)
    text += (text.empty() ? "" : ", ") + std::string("magic ") + std::to_string(f.magic) + " version " +
            std::to_string(f.version) + " (" + f.model + ", " + (f.dtype == TokenDtype::uint16 ? "uint16" : "uint32") +
            " tokens)";
  return text;
}

const LlmcFormat* llmc_format_of_magic(std::int32_t magic) {
  for (const LlmcFormat& format : kLlmcFormats)
    if (format.magic == magic) return &format;
  return nullptr;
}

const char* name_of(TokenDtype dtype) { return dtype == TokenDtype::uint16 ? "uint16" : "uint32"; }
/// NumPy's .npy magic, a version it writes (1.0, 2.0, 3.0) and a header that opens a dict: by chance in
/// a token stream about never.
bool is_npy(const void* data, std::size_t size) {
  const std::string_view bytes(static_cast<const char*>(data), size);
  if (bytes.size() < 13 || !bytes.starts_with("\x93NUMPY") || bytes[7] != '\0') return false;
  if (bytes[6] < '\x01' || bytes[6] > '\x03') return false;
  return bytes[bytes[6] == '\x01' ? 10 : 12] == '{';  // version 1: a 2-byte header length; 2 and 3: 4 bytes
}

std::int64_t bytes_of(TokenDtype dtype) { return dtype == TokenDtype::uint16 ? 2 : 4; }

/// Fills rows of `input` and `target` (each `context` int64s per window) from the windows at
/// `indices`. The tokens start at offset 0 or 1024 of a page-aligned mapping, so they are aligned.
template <class Token>
void copy_windows(const std::byte* tokens, std::span<const std::int64_t> indices, std::int64_t context,
                  std::int64_t stride, std::int64_t* input, std::int64_t* target) {
  for (const std::int64_t index : indices) {
    const Token* window = reinterpret_cast<const Token*>(tokens) + index * stride;
    for (std::int64_t j = 0; j < context; ++j) {
      input[j] = window[j];
      target[j] = window[j + 1];
    }
    input += context;
    target += context;
  }
}

}  // namespace

TokenDataset::TokenDataset(std::string path, TokenDatasetOptions options)
    : path_(std::move(path)), context_(options.context), stride_(options.stride ? options.stride : options.context),
      dtype_(options.dtype) {
  if (context_ < 1)
    throw DataError("TokenDataset: context must be at least 1 token, got " + std::to_string(context_) + " (for " +
                    path_ + ").");
  if (options.stride < 0)
    throw DataError("TokenDataset: stride must be at least 1 token (or 0: the context), got " +
                    std::to_string(options.stride) + " (for " + path_ + ").");
  // The loader may read in order or shuffled, and a window may span pages: the kernel's default
  // read-around serves both; MADV_RANDOM would make a cold in-order epoch one 4 KiB read per page.
  file_ = std::make_shared<const detail::MappedFile>(path_, detail::Access::normal, "TokenDataset");
  const auto file_size = static_cast<std::int64_t>(file_->size());
  std::int32_t header[3] = {};
  if (file_size >= static_cast<std::int64_t>(sizeof header)) std::memcpy(header, file_->data(), sizeof header);
  if (is_npy(file_->data(), file_->size()))
    throw DataError("TokenDataset: " + path_ + " is a NumPy .npy file (np.save), whose header would be read as tokens: "
                    "write the tokens raw (tokens.astype(np.uint16).tofile(path)), or read the file with "
                    "fulgur::data::NpyArray.");
  if (const LlmcFormat* format = llmc_format_of_magic(header[0])) {
    const std::string magic = std::to_string(format->magic);
    if (file_size < kLlmcHeaderBytes)
      throw DataError("TokenDataset: " + path_ + " starts with llm.c's magic " + magic + " (" + format->model +
                      ") but has only " + std::to_string(file_size) +
                      " bytes, fewer than llm.c's 1024-byte header: it is truncated; write it again.");
    if (header[1] != format->version)
      throw DataError("TokenDataset: " + path_ + " has llm.c's header (magic " + magic + ", " + format->model +
                      ") with version " + std::to_string(header[1]) + ", where llm.c writes version " +
                      std::to_string(format->version) + " (" + name_of(format->dtype) + " tokens); llm.c's formats are " +
                      llmc_formats_text() + ". Write it with llm.c's data scripts (write_datafile), or without the "
                      "header as a plain .bin.");
    dtype_ = format->dtype;
    tokens_offset_ = kLlmcHeaderBytes;
    const std::int64_t present = file_size - kLlmcHeaderBytes, expected = std::int64_t{header[2]} * bytes_of(dtype_);
    if (header[2] < 0)
      throw DataError("TokenDataset: " + path_ + " has llm.c's header saying " + std::to_string(header[2]) +
                      " tokens, a negative count: the header is damaged or does not belong to the file; write it "
                      "again.");
    if (present != expected)
      throw DataError("TokenDataset: " + path_ + " has llm.c's header saying " + std::to_string(header[2]) + " " +
                      name_of(dtype_) + " tokens (" + std::to_string(expected) +
                      " bytes after the 1024-byte header), "
                      "but the file has " +
                      std::to_string(present) +
                      " bytes after it: it is truncated or its "
                      "header does not belong to it; write it again.");
    num_tokens_ = header[2];
  } else {
    const std::int64_t token_bytes = bytes_of(dtype_);
    if (file_size % token_bytes != 0)
      throw DataError("TokenDataset: " + path_ + " has " + std::to_string(file_size) + " bytes, not a multiple of " +
                      std::to_string(token_bytes) + " (the size of a " + name_of(dtype_) + " token): it is truncated" +
                      (file_size % 2 == 0 ? ", or holds uint16 tokens: pass .dtype = TokenDtype::uint16."
                                          : " or is not a token file; write it again."));
    num_tokens_ = file_size / token_bytes;
  }
  if (num_tokens_ - 1 < context_)
    throw DataError("TokenDataset: " + path_ + " has " + std::to_string(num_tokens_) + " " + name_of(dtype_) +
                    " tokens, too few for one window: context " + std::to_string(context_) +
                    " needs context + 1 = " +
                    (context_ < INT64_MAX ? std::to_string(context_ + 1) : std::string("more than INT64_MAX")) +
                    " tokens (the target is the input shifted by one); give a "
                    "smaller context or a longer file.");
}

void TokenDataset::check_index(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw DataError("TokenDataset: index " + std::to_string(index) + " is out of range for " + path_ + ", which has " +
                    std::to_string(size()) + " windows of " + std::to_string(context_) + " tokens (stride " +
                    std::to_string(stride_) + "); indices go from 0 to size() - 1.");
}

Batch TokenDataset::get(std::int64_t index) const {
  Batch window = get_batch(std::span<const std::int64_t>(&index, 1));
  return Batch{window.input.squeeze(0), window.target.squeeze(0)};
}

Batch TokenDataset::get_batch(std::span<const std::int64_t> indices) const {
  for (const std::int64_t index : indices) check_index(index);
  const auto rows = static_cast<std::int64_t>(indices.size());
  Batch batch{at::empty({rows, context_}, at::kLong), at::empty({rows, context_}, at::kLong)};
  const std::byte* tokens = file_->data() + tokens_offset_;
  auto* input = batch.input.data_ptr<std::int64_t>();
  auto* target = batch.target.data_ptr<std::int64_t>();
  if (dtype_ == TokenDtype::uint16)
    copy_windows<std::uint16_t>(tokens, indices, context_, stride_, input, target);
  else
    copy_windows<std::uint32_t>(tokens, indices, context_, stride_, input, target);
  return batch;
}

}  // namespace fulgur::data
