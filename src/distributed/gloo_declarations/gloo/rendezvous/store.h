#pragma once
// see ../../README.md
#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store {  // the interface ProcessGroupGloo::GlooStore overrides (never instantiated by fulgur)
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace gloo::rendezvous
