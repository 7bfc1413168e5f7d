// StateDict's members (include/fulgur/state_dict.hpp), compiled once.
#include "fulgur/state_dict.hpp"

namespace fulgur {

StateDict::StateDict() : dict_(c10::StringType::get(), c10::AnyType::get()) {}
StateDict::StateDict(const c10::impl::GenericDict& dict) : dict_(dict) {}
StateDict::StateDict(const StateDict& other) = default;
StateDict::StateDict(StateDict&& other) noexcept = default;
StateDict& StateDict::operator=(const StateDict& other) = default;
StateDict& StateDict::operator=(StateDict&& other) noexcept = default;
StateDict::~StateDict() = default;

void StateDict::insert(const std::string& key, c10::IValue value) {
  dict_.insert_or_assign(c10::IValue(key), std::move(value));
}
bool StateDict::contains(const std::string& key) const { return dict_.contains(c10::IValue(key)); }
c10::IValue StateDict::at(const std::string& key) const { return dict_.at(c10::IValue(key)); }
bool StateDict::erase(const std::string& key) { return dict_.erase(c10::IValue(key)); }

}  // namespace fulgur
