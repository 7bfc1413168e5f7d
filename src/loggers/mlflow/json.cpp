#include "json.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace fulgur::loggers::mlflow {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::optional<Json> document() {
    Json value;
    if (!parse(value, 0)) return std::nullopt;
    skip_space();
    if (at_ != text_.size()) return std::nullopt;
    return value;
  }

 private:
  static constexpr int max_depth = 64;

  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t'))
      ++at_;
  }
  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }
  bool parse(Json& out, int depth) {
    if (depth > max_depth) return false;
    skip_space();
    if (at_ >= text_.size()) return false;
    const char c = text_[at_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out.kind = Json::Kind::string;
      return string(out.text);
    }
    for (const std::string_view word : {std::string_view("true"), std::string_view("false")})
      if (literal(word)) {
        out.kind = Json::Kind::boolean;
        out.text = std::string(word);
        return true;
      }
    if (literal("null")) return true;
    const std::size_t start = at_;
    while (at_ < text_.size() && std::string_view("+-0123456789.eE").find(text_[at_]) != std::string_view::npos) ++at_;
    if (at_ == start) return false;
    out.kind = Json::Kind::number;
    out.text = std::string(text_.substr(start, at_ - start));
    return true;
  }
  bool object(Json& out, int depth) {
    out.kind = Json::Kind::object;
    ++at_;
    skip_space();
    if (at_ < text_.size() && text_[at_] == '}') return ++at_, true;
    while (true) {
      skip_space();
      std::string key;
      if (at_ >= text_.size() || text_[at_] != '"' || !string(key)) return false;
      skip_space();
      if (at_ >= text_.size() || text_[at_++] != ':') return false;
      if (!parse(out.fields[key], depth + 1)) return false;
      skip_space();
      if (at_ >= text_.size()) return false;
      if (text_[at_] == '}') return ++at_, true;
      if (text_[at_++] != ',') return false;
    }
  }
  bool array(Json& out, int depth) {
    out.kind = Json::Kind::array;
    ++at_;
    skip_space();
    if (at_ < text_.size() && text_[at_] == ']') return ++at_, true;
    while (true) {
      if (!parse(out.items.emplace_back(), depth + 1)) return false;
      skip_space();
      if (at_ >= text_.size()) return false;
      if (text_[at_] == ']') return ++at_, true;
      if (text_[at_++] != ',') return false;
    }
  }
  bool string(std::string& out) {
    ++at_;  // the opening quote
    while (at_ < text_.size()) {
      const char c = text_[at_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) return false;
      const char e = text_[at_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': if (!unicode(out)) return false; break;
        default: out += e;  // \" \\ \/
      }
    }
    return false;
  }
  bool hex4(unsigned& code) {
    if (at_ + 4 > text_.size()) return false;
    const auto [end, ec] = std::from_chars(text_.data() + at_, text_.data() + at_ + 4, code, 16);
    if (ec != std::errc() || end != text_.data() + at_ + 4) return false;
    at_ += 4;
    return true;
  }
  bool unicode(std::string& out) {
    unsigned code = 0;
    if (!hex4(code)) return false;
    if (code >= 0xD800 && code < 0xDC00 && text_.substr(at_, 2) == "\\u") {  // a surrogate pair
      at_ += 2;
      unsigned low = 0;
      if (!hex4(low)) return false;
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    auto put = [&](unsigned byte) { out += static_cast<char>(byte); };
    if (code < 0x80) {
      put(code);
    } else if (code < 0x800) {
      put(0xC0 | (code >> 6)), put(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      put(0xE0 | (code >> 12)), put(0x80 | ((code >> 6) & 0x3F)), put(0x80 | (code & 0x3F));
    } else {
      put(0xF0 | (code >> 18)), put(0x80 | ((code >> 12) & 0x3F)), put(0x80 | ((code >> 6) & 0x3F)),
          put(0x80 | (code & 0x3F));
    }
    return true;
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

}  // namespace

const Json* Json::find(std::string_view path) const {
  const Json* node = this;
  while (!path.empty()) {
    const std::size_t dot = path.find('.');
    const std::string key(path.substr(0, dot));
    if (node->kind != Kind::object) return nullptr;
    const auto at = node->fields.find(key);
    if (at == node->fields.end()) return nullptr;
    node = &at->second;
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  return node;
}

std::string Json::string_at(std::string_view path) const {
  const Json* node = find(path);
  return node != nullptr && node->kind == Kind::string ? node->text : std::string();
}

std::optional<Json> parse_json(std::string_view text) { return Parser(text).document(); }

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char digits[] = "0123456789abcdef";
          out += "\\u00";
          out += digits[(c >> 4) & 0xF];
          out += digits[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

}  // namespace fulgur::loggers::mlflow
