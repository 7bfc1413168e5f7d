// Checkpoint files, module state and optimizer state.
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "fulgur/errors.hpp"

namespace fulgur::checkpoint {

namespace {
[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw Error("fulgur: " + what + " '" + path + "': " + std::strerror(errno));
}

void write_all(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write", path);
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void collect_module_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& child : module.named_children()) collect_module_state(*child.value(), prefix + child.key() + ".", out);
}

std::string file_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size(); ++i) out += (i ? ", \"" : "\"") + keys[i] + "\"";
  return out;
}
}  // namespace

void atomic_write(const std::string& path, const std::vector<char>& bytes) {
  const std::string folder = detail::parent_folder(path);
  detail::make_directories(folder);
  const std::string temporary = folder + "/." + file_name(path) + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("cannot create", temporary);
  try {
    write_all(fd, bytes.data(), bytes.size(), temporary);
    if (::fsync(fd) != 0) io_error("cannot fsync", temporary);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    io_error("cannot rename the temporary file onto", path);
  }
  // The rename is durable only once the folder's entry is on disk.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::vector<char> to_bytes(const StateDict& state) { return torch::pickle_save(state.to_ivalue()); }

StateDict from_bytes(const std::vector<char>& bytes, const std::string& what) {
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw Error("fulgur: " + what + " is not a readable checkpoint (" + std::string(e.what()).substr(0, 200) +
                "); pass a file written by fulgur's save.");
  }
  if (!value.isGenericDict()) throw Error("fulgur: " + what + " does not hold a dictionary.");
  StateDict out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) throw Error("fulgur: " + what + " has a non-string key.");
    out.insert(item.key().toStringRef(), item.value());
  }
  return out;
}

void save(const std::string& path, const StateDict& state) { atomic_write(path, to_bytes(state)); }

StateDict load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("fulgur: cannot open checkpoint '" + path + "': " + std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return from_bytes(bytes, "'" + path + "'");
}

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out;
  collect_module_state(module, "", out);
  return out;
}

void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  const StateDict own = module_state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& item : own)
    if (!state.contains(item.key().toStringRef())) missing.push_back(item.key().toStringRef());
  for (const auto& item : state)
    if (!own.contains(item.key().toStringRef())) unexpected.push_back(item.key().toStringRef());
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (!state.contains(key)) continue;
    const c10::IValue source = state.at(key);
    const at::Tensor target = item.value().toTensor();
    if (!source.isTensor() || source.toTensor().sizes() != target.sizes())
      mismatched.push_back(key + " (expected shape " + c10::str(target.sizes()) +
                           (source.isTensor() ? ", got " + c10::str(source.toTensor().sizes()) : ", got a non-tensor") + ")");
  }
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string message = "Error(s) in loading state_dict for " + module.name() + ":";
    if (strict && !missing.empty()) message += "\n\tMissing key(s) in state_dict: " + quoted_list(missing) + ".";
    if (strict && !unexpected.empty()) message += "\n\tUnexpected key(s) in state_dict: " + quoted_list(unexpected) + ".";
    for (const auto& m : mismatched) message += "\n\tsize mismatch for " + m + ".";
    if (strict) message += "\nTo load only the keys that match, pass strict = false.";
    throw Error(message);
  }
  at::NoGradGuard no_grad;
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (state.contains(key)) item.value().toTensor().copy_(state.at(key).toTensor());
  }
}

// LibTorch's optimizers keep their state in typed per-parameter objects that only its own
// archive format can round-trip exactly; the StateDict carries that archive as bytes.
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream stream;
  archive.save_to(stream);
  const std::string bytes = stream.str();
  StateDict out;
  out.insert("format", std::string("libtorch-optimizer-archive"));
  out.insert("archive", at::from_blob(const_cast<char*>(bytes.data()), {static_cast<std::int64_t>(bytes.size())},
                                      at::kByte)
                            .clone());
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
  if (!state.contains("archive") || !state.at("archive").isTensor())
    throw Error("fulgur: the optimizer state has no 'archive' entry; pass a state from optimizer_state_dict().");
  const at::Tensor bytes = state.at("archive").toTensor().contiguous();
  std::istringstream stream(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  optimizer.load(archive);
}

}  // namespace fulgur::checkpoint
