#pragma once
// fulgur::StateDict: the state of a policy, module or optimizer — an insertion-ordered,
// string-keyed dictionary of IValues (tensors, doubles, ints, strings, nested dicts), which is
// what Python's `state_dict()` returns and what torch::pickle_save writes as a Python dict.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <string>

namespace fulgur {

class StateDict {
 public:
  // Out of line (src/state_dict.cpp): c10::Dict's code is compiled once, not in every program that
  // keeps a state.
  StateDict();
  /// From a dictionary IValue with string keys (e.g. what torch::pickle_load returns).
  explicit StateDict(const c10::impl::GenericDict& dict);  // a handle: copying it shares the dictionary
  StateDict(const StateDict& other);
  StateDict(StateDict&& other) noexcept;
  StateDict& operator=(const StateDict& other);
  StateDict& operator=(StateDict&& other) noexcept;
  ~StateDict();

  /// Inserts or replaces; keeps the first insertion's position.
  void insert(const std::string& key, c10::IValue value);
  bool contains(const std::string& key) const;
  /// The value under key; throws c10::Error when absent (use contains first).
  c10::IValue at(const std::string& key) const;
  bool erase(const std::string& key);
  bool empty() const { return dict_.empty(); }
  std::size_t size() const { return dict_.size(); }

  /// Items in insertion order: item.key().toStringRef(), item.value().
  auto begin() const { return dict_.begin(); }
  auto end() const { return dict_.end(); }

  const c10::impl::GenericDict& dict() const { return dict_; }
  c10::IValue to_ivalue() const { return c10::IValue(dict_); }

 private:
  c10::impl::GenericDict dict_;
};

}  // namespace fulgur
