#pragma once
// see ../README.md
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // named by an inline member fulgur never calls
};
}  // namespace gloo
