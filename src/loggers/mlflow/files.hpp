#pragma once
// MLFlowLogger's files through POSIX, never std::filesystem: the torch wheel's libtorch.so exports its
// own copy of std::filesystem's functions, which interposes on libstdc++'s in every program that
// links LibTorch, and some crash (remove_all; see fulgur/detail/files.hpp). fulgur::mlflow is
// torch-free and does not link fulgur's own helpers, hence these few.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fulgur::loggers::mlflow::files {

/// mkdir -p; throws std::runtime_error naming the path and the OS error.
void make_directories(const std::string& folder);
bool exists(const std::string& path);
bool is_directory(const std::string& path);
struct Entry {
  std::string name;
  bool directory = false;
  bool regular = false;
};
/// The entries of a folder ("." and ".." left out); none when it cannot be read.
std::vector<Entry> list(const std::string& folder);
/// From the root (a relative path is taken from the current directory), without "." and ".." parts.
std::string absolute(const std::string& path);
std::string join(const std::string& folder, const std::string& name);
std::string parent(const std::string& path);
std::string file_name(const std::string& path);
/// The file name without its last extension ("epoch=1.ckpt" -> "epoch=1").
std::string stem(const std::string& path);
std::optional<std::string> read(const std::string& path);
/// Written to a temporary file renamed over `path` (a reader sees the old file or the new one); the
/// folder is created. Throws naming the path.
void write_atomically(const std::string& path, const std::string& text);
void append(const std::string& path, const std::string& text);
void copy_file(const std::string& from, const std::string& to);
void remove_tree(const std::string& path);
std::string temp_folder();  ///< $TMPDIR, else /tmp
/// The time of the last change, in ns; nullopt when the file is gone.
std::optional<std::int64_t> modified_ns(const std::string& path);
std::string program_path();  ///< /proc/self/exe

}  // namespace fulgur::loggers::mlflow::files
