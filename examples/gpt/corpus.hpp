#pragma once
// The example's data preparation: a text file becomes train.bin and val.bin of byte tokens (0-255),
// in llm.c's layout (a 1024-byte header — magic 20240520, version 1 for uint16 tokens, the token
// count — then the tokens), which fulgur::data::TokenDataset, llm.c and numpy all read.
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

struct PreparedCorpus {
  std::int64_t train_tokens = 0, val_tokens = 0;
};

inline void write_token_file(const std::filesystem::path& path, const unsigned char* bytes, std::int64_t count) {
  std::array<std::int32_t, 256> header{};
  header[0] = 20240520;  // llm.c's magic
  header[1] = 1;         // version 1: uint16 tokens
  header[2] = static_cast<std::int32_t>(count);
  std::vector<std::uint16_t> tokens(bytes, bytes + count);
  const std::filesystem::path partial = path.string() + ".partial";  // a crash never leaves a short file named .bin
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), sizeof header);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    if (!out.flush()) throw std::runtime_error("cannot write " + partial.string());
  }
  std::filesystem::rename(partial, path);
}

/// Splits the bytes of `text_file` into out_dir/train.bin (the first 1 - val_fraction) and
/// out_dir/val.bin (the rest). Refuses a text too short to give both sets a window of `context`.
inline PreparedCorpus prepare_corpus(const std::filesystem::path& text_file, const std::filesystem::path& out_dir,
                                     double val_fraction, std::int64_t context) {
  std::ifstream in(text_file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open the text file " + text_file.string());
  const std::vector<unsigned char> text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!(val_fraction > 0.0 && val_fraction < 1.0))
    throw std::runtime_error("--val-fraction must be between 0 and 1 (exclusive), got " + std::to_string(val_fraction));
  const auto total = static_cast<std::int64_t>(text.size());
  const auto val = static_cast<std::int64_t>(static_cast<double>(total) * val_fraction), train = total - val;
  if (val < context + 1 || train < context + 1)
    throw std::runtime_error(text_file.string() + " has " + std::to_string(total) + " bytes: too short to give " +
                             "the training and the validation set one window of " + std::to_string(context) +
                             " + 1 bytes each at --val-fraction " + std::to_string(val_fraction) +
                             "; give a longer text.");
  if (total > INT32_MAX) throw std::runtime_error(text_file.string() + " is over 2 GiB, more than llm.c's header counts");
  std::filesystem::create_directories(out_dir);
  write_token_file(out_dir / "train.bin", text.data(), train);
  write_token_file(out_dir / "val.bin", text.data() + train, val);
  return {train, val};
}

/// Token ids as text: the bytes themselves (UTF-8 passes through), but control characters other
/// than newline and tab shown as '?'.
inline std::string decode(const std::vector<std::int64_t>& ids) {
  std::string text;
  for (const std::int64_t id : ids)
    text += (id == '\n' || id == '\t' || (id >= 32 && id != 127)) ? static_cast<char>(id) : '?';
  return text;
}

}  // namespace gpt
