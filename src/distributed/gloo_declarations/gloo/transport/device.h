#pragma once
// see ../../README.md
namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
