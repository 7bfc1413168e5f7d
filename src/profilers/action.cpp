// The process-wide table of action names (fulgur/profilers/action.hpp).
#include "fulgur/profilers/action.hpp"

#include <atomic>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cxxabi.h>

namespace fulgur {
namespace {

struct ActionTable {
  std::mutex mutex;
  std::deque<std::string> names;  // a deque: a name's address stays put while others are added
  std::unordered_map<std::string_view, std::uint32_t> ids;
  std::atomic<std::size_t> count{0};
};

ActionTable& table() {
  static ActionTable instance;
  return instance;
}

std::atomic<std::uint64_t> generation{0};

}  // namespace

Action::Action(std::string_view name) {
  ActionTable& t = table();
  const std::lock_guard lock(t.mutex);
  if (const auto found = t.ids.find(name); found != t.ids.end()) {
    id_ = found->second;
    return;
  }
  id_ = static_cast<std::uint32_t>(t.names.size());
  const std::string& stored = t.names.emplace_back(name);
  t.ids.emplace(stored, id_);
  t.count.store(t.names.size(), std::memory_order_release);
}

std::string_view Action::name() const { return profiling::action_name(id_); }

namespace profiling {

std::size_t action_count() { return table().count.load(std::memory_order_acquire); }

std::string_view action_name(std::uint32_t id) {
  ActionTable& t = table();
  const std::lock_guard lock(t.mutex);
  return t.names.at(id);
}

std::string class_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   std::free);
  std::string full = status == 0 && demangled ? demangled.get() : type.name();
  // The last component at template depth 0: "a::b::Net<c::D>" -> "Net<c::D>".
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (full[i] == '<' || full[i] == '(') ++depth;
    else if (full[i] == '>' || full[i] == ')') --depth;
    else if (depth == 0 && full[i] == ':' && i + 1 < full.size() && full[i + 1] == ':') start = i + 2;
  }
  std::string name = full.substr(start);
  constexpr std::string_view impl = "Impl";
  if (name.size() > impl.size() && name.ends_with(impl)) name.resize(name.size() - impl.size());
  return name;
}

std::uint64_t run_generation() { return generation.load(std::memory_order_relaxed); }
void start_run_generation() { generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace profiling
}  // namespace fulgur
