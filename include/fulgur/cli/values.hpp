#pragma once
// How fulgur::cli reads and writes each C++ type of a described field (value_traits<T>: its name in
// --help, reading it from a YAML value, writing it back), and the schema of a described struct.
// Types: bool, integers, floating point, std::string, named enums, std::optional, std::vector,
// std::variant, std::chrono durations, and described structs (a group of keys). Add a type by
// specializing value_traits.
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fulgur/cli/fields.hpp"
#include "fulgur/cli/resolve.hpp"
#include "fulgur/cli/schema.hpp"

namespace fulgur::cli {

/// type(): the name --help shows; read(node, value): false when `node` is not one; write(value).
template <class T>
struct value_traits;

template <class T>
concept readable = requires(const YAML::Node& node, T& value) {
  { value_traits<T>::type() } -> std::convertible_to<std::string>;
  { value_traits<T>::read(node, value) } -> std::same_as<bool>;
  { value_traits<T>::write(value) } -> std::same_as<YAML::Node>;
};

template <>
struct value_traits<bool> {
  static std::string type() { return "bool"; }
  static bool read(const YAML::Node& node, bool& value) {
    const auto flag = as_bool(node);
    if (flag) value = *flag;
    return flag.has_value();
  }
  static YAML::Node write(bool value) { return YAML::Node(value ? "true" : "false"); }
};

template <class T>
  requires(std::integral<T> && !std::same_as<T, bool>)
struct value_traits<T> {
  static std::string type() { return std::is_unsigned_v<T> ? "int (>= 0)" : "int"; }
  static bool read(const YAML::Node& node, T& value) {
    const auto integer = as_integer(node);
    if (!integer || *integer < static_cast<long long>(std::numeric_limits<T>::min()) ||
        (std::is_unsigned_v<T> ? static_cast<unsigned long long>(*integer) >
                                     static_cast<unsigned long long>(std::numeric_limits<T>::max())
                               : *integer > static_cast<long long>(std::numeric_limits<T>::max())))
      return false;
    value = static_cast<T>(*integer);
    return true;
  }
  static YAML::Node write(T value) { return YAML::Node(std::to_string(value)); }
};

template <std::floating_point T>
struct value_traits<T> {
  static std::string type() { return "float"; }
  static bool read(const YAML::Node& node, T& value) {
    const auto number = as_number(node);
    if (number) value = static_cast<T>(*number);
    return number.has_value();
  }
  static YAML::Node write(T value) { return YAML::Node(number_text(static_cast<double>(value))); }
};

template <>
struct value_traits<std::string> {
  static std::string type() { return "str"; }
  static bool read(const YAML::Node& node, std::string& value) {
    if (!node.IsScalar() || is_null(node)) return false;  // null is not a text ("" is): str | null is optional<std::string>
    value = node.Scalar();
    return true;
  }
  static YAML::Node write(const std::string& value) { return string_node(value); }
};

template <named_enum E>
struct value_traits<E> {
  static std::string type() {
    std::string out;
    for (const auto& [e, name] : enum_names<E>::values) out += (out.empty() ? "" : " | ") + std::string(name);
    return out;
  }
  static bool read(const YAML::Node& node, E& value) {
    if (!node.IsScalar()) return false;
    for (const auto& [e, name] : enum_names<E>::values)
      if (node.Scalar() == name) {
        value = e;
        return true;
      }
    return false;
  }
  static YAML::Node write(E value) {
    for (const auto& [e, name] : enum_names<E>::values)
      if (e == value) return YAML::Node(std::string(name));
    return YAML::Node(YAML::NodeType::Null);
  }
};

template <readable T>
struct value_traits<std::optional<T>> {
  static std::string type() { return value_traits<T>::type() + " | null"; }
  static bool read(const YAML::Node& node, std::optional<T>& value) {
    if (is_null(node)) {
      value.reset();
      return true;
    }
    T inner{};
    if (!value_traits<T>::read(node, inner)) return false;
    value = std::move(inner);
    return true;
  }
  static YAML::Node write(const std::optional<T>& value) {
    return value ? value_traits<T>::write(*value) : YAML::Node(YAML::NodeType::Null);
  }
};

template <readable T>
struct value_traits<std::vector<T>> {
  static std::string type() { return "list[" + value_traits<T>::type() + "]"; }
  static bool read(const YAML::Node& node, std::vector<T>& value) {
    if (!node.IsSequence()) return false;
    std::vector<T> out(node.size());
    for (std::size_t i = 0; i < node.size(); ++i)
      if (!value_traits<T>::read(node[i], out[i])) return false;
    value = std::move(out);
    return true;
  }
  static YAML::Node write(const std::vector<T>& value) {
    YAML::Node seq(YAML::NodeType::Sequence);
    for (const auto& v : value) seq.push_back(value_traits<T>::write(v));
    return seq;
  }
};

/// The first alternative, in order, that reads the value (put std::string last).
template <readable... T>
struct value_traits<std::variant<T...>> {
  static std::string type() {
    std::string out;
    ((out += (out.empty() ? "" : " | ") + value_traits<T>::type()), ...);
    return out;
  }
  static bool read(const YAML::Node& node, std::variant<T...>& value) {
    return ([&] {
      T inner{};
      if (!value_traits<T>::read(node, inner)) return false;
      value = std::move(inner);
      return true;
    }() || ...);
  }
  static YAML::Node write(const std::variant<T...>& value) {
    return std::visit([](const auto& v) { return value_traits<std::remove_cvref_t<decltype(v)>>::write(v); }, value);
  }
};

/// A duration: seconds (a number), "DD:HH:MM:SS" (also "HH:MM:SS", "MM:SS"), or {days, hours, minutes,
/// seconds} — Lightning's max_time forms.
template <class Rep, class Period>
struct value_traits<std::chrono::duration<Rep, Period>> {
  using D = std::chrono::duration<Rep, Period>;
  static std::string type() {
    return "duration >= 0 (seconds, \"DD:HH:MM:SS\", \"HH:MM:SS\", \"MM:SS\" or a mapping of days, hours, minutes, "
           "seconds)";
  }
  static bool read(const YAML::Node& node, D& value) {
    double seconds = 0;
    if (const auto number = as_number(node)) {
      seconds = *number;
    } else if (node.IsScalar()) {
      const std::string& text = node.Scalar();
      std::vector<double> parts;
      std::size_t start = 0;
      while (true) {
        const std::size_t colon = text.find(':', start);
        const auto part = as_number(YAML::Node(text.substr(start, colon - start)));
        if (!part) return false;
        parts.push_back(*part);
        if (colon == std::string::npos) break;
        start = colon + 1;
      }
      if (parts.size() < 2 || parts.size() > 4) return false;
      static constexpr double unit[] = {1, 60, 3600, 86400};
      for (std::size_t i = 0; i < parts.size(); ++i) seconds += parts[parts.size() - 1 - i] * unit[i];
    } else if (node.IsMap()) {
      for (const auto& entry : node) {
        const std::string key = entry.first.Scalar();
        const auto amount = as_number(entry.second);
        if (!amount) return false;
        if (key == "days") seconds += *amount * 86400;
        else if (key == "hours") seconds += *amount * 3600;
        else if (key == "minutes") seconds += *amount * 60;
        else if (key == "seconds") seconds += *amount;
        else return false;
      }
    } else {
      return false;
    }
    if (!(seconds >= 0) || !std::isfinite(seconds)) return false;
    // Beyond D's range the cast is undefined (a fuzzed "00:1e20:00:00" came back negative).
    if (seconds >= std::chrono::duration<double>(D::max()).count()) return false;
    value = std::chrono::duration_cast<D>(std::chrono::duration<double>(seconds));
    return true;
  }
  static YAML::Node write(const D& value) {
    const double seconds = std::chrono::duration<double>(value).count();
    // A fraction, or more seconds than "DD:HH:MM:SS" can count in a long long: plain seconds.
    if (seconds != std::floor(seconds) || seconds >= 9.2e18) return YAML::Node(number_text(seconds));
    auto whole = static_cast<long long>(seconds);
    char text[48];
    std::snprintf(text, sizeof text, "%02lld:%02lld:%02lld:%02lld", whole / 86400, whole / 3600 % 24, whole / 60 % 60,
                  whole % 60);
    return YAML::Node(std::string(text));
  }
};

// ---- described structs ---------------------------------------------------------------------------

/// The keys of a described struct, with the defaults `defaults` has.
template <described T>
std::vector<Schema> schema_of(const T& defaults = T{}) {
  std::vector<Schema> out;
  for_each_field<T>([&](const auto& f) {
    using V = typename std::remove_cvref_t<decltype(f)>::value_type;
    if constexpr (described<V>) {
      out.push_back(group(std::string(f.name), std::string(f.doc), schema_of<V>(defaults.*(f.member))));
    } else {
      static_assert(readable<V>, "fulgur::cli: a described field's type has no value_traits (bool, integers, floating "
                                 "point, std::string, named enums, optional, vector, variant, durations, described "
                                 "structs; specialize fulgur::cli::value_traits for others)");
      Schema s;
      s.name = std::string(f.name);
      s.kind = Schema::Kind::value;
      s.doc = std::string(f.doc);
      s.type = value_traits<V>::type();
      s.default_value = value_traits<V>::write(defaults.*(f.member));
      s.check = [probe_default = defaults.*(f.member)](const YAML::Node& node) -> std::optional<std::string> {
        V probe = probe_default;
        if (value_traits<V>::read(node, probe)) return std::nullopt;
        return value_traits<V>::type();
      };
      s.normalize = [probe_default = defaults.*(f.member)](const YAML::Node& node) {
        V value = probe_default;
        value_traits<V>::read(node, value);
        return value_traits<V>::write(value);
      };
      if constexpr (std::is_same_v<V, std::string>) s.text = Schema::Text::raw;
      if constexpr (std::is_same_v<V, std::optional<std::string>>) s.text = Schema::Text::raw_or_null;
      out.push_back(std::move(s));
    }
  });
  return out;
}

/// Sets each field of `out` that `node` (a mapping) has; `path` names the keys in errors.
template <described T>
void read_into(const YAML::Node& node, T& out, const std::string& path) {
  if (!node || is_null(node)) return;
  for_each_field<T>([&](const auto& f) {
    using V = typename std::remove_cvref_t<decltype(f)>::value_type;
    const YAML::Node value = node[std::string(f.name)];
    if (!value) return;
    const std::string key = path.empty() ? std::string(f.name) : path + "." + std::string(f.name);
    if constexpr (described<V>) {
      read_into(value, out.*(f.member), key);
    } else if (!value_traits<V>::read(value, out.*(f.member))) {
      throw ConfigError({key + ": expected " + value_traits<V>::type() + ", got '" +
                         (value.IsScalar() ? value.Scalar() : std::string("a list or mapping")) + "'"});
    }
  });
}

template <described T>
T read_as(const YAML::Node& node, const std::string& path, T out = T{}) {
  read_into(node, out, path);
  return out;
}

}  // namespace fulgur::cli
