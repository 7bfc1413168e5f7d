// fulgur::cli's config: the command line, defaults, environment, files and overrides merged against
// the schema, with every problem named by where it came from.
#include "fulgur/cli/resolve.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <utility>

#include <yaml-cpp/eventhandler.h>

#include "fulgur/detail/files.hpp"
#include "fulgur/detail/trainer_support.hpp"

namespace fulgur::cli {

namespace {

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out = lines.size() == 1 ? "fulgur::cli: " : "fulgur::cli: " + std::to_string(lines.size()) + " problems:";
  for (const auto& line : lines) out += (lines.size() == 1 ? "" : "\n  ") + line;
  return out;
}

std::string describe_given(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a mapping";
}

std::string where_in_file(const std::string& file, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

/// Each key given twice in one mapping, anywhere in `node`, as (where, what). PyYAML (which Lightning's
/// CLI reads with) keeps the last without a word, and so does fulgur's reading, which applies the entries
/// in order: the first is a setting its writer believes in and that never applies. A node reached again
/// through an alias (&a ... *a) is read once: an alias may point back into itself or fan out.
void find_duplicate_keys(const YAML::Node& node, const std::string& file, const std::string& path,
                         std::vector<std::pair<std::string, std::string>>& found, std::vector<YAML::Node>& seen_nodes) {
  if (!node.IsSequence() && !node.IsMap()) return;
  if (std::ranges::any_of(seen_nodes, [&](const YAML::Node& seen) { return seen.is(node); })) return;
  seen_nodes.push_back(node);
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      find_duplicate_keys(node[i], file, path + "[" + std::to_string(i) + "]", found, seen_nodes);
    return;
  }
  std::vector<std::pair<std::string, YAML::Mark>> keys;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) continue;
    const std::string& key = entry.first.Scalar();
    const std::string dotted = path.empty() ? key : path + "." + key;
    const auto first = std::ranges::find(keys, key, &std::pair<std::string, YAML::Mark>::first);
    if (first != keys.end())
      found.emplace_back(where_in_file(file, entry.first),
                         dotted + " is given twice in this mapping (first at line " +
                             std::to_string(first->second.line + 1) + "); keep one: YAML would keep only the last");
    else
      keys.emplace_back(key, entry.first.Mark());
    find_duplicate_keys(entry.second, file, dotted, found, seen_nodes);
  }
}

/// Where a YAML text's second document starts, if it has one. Not YAML::LoadAll: yaml-cpp 0.7 returns
/// endless documents at one place for some malformed text (fuzz.cli found it), so a document counts
/// only where it starts after the first, and no more than two are read.
std::optional<YAML::Mark> second_document(const std::string& text) {
  struct DocumentStarts : YAML::EventHandler {
    YAML::Mark start;
    void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts first, second;
  if (!parser.HandleNextDocument(first) || !parser.HandleNextDocument(second)) return std::nullopt;
  if (second.start.pos <= first.start.pos) return std::nullopt;
  return second.start;
}

/// A hint for a syntax error in text indented with tabs, which YAML refuses and yaml-cpp reports as
/// something else ("illegal map value"): the last line up to the error's whose indentation has a tab.
std::string tab_indent_hint(std::string_view text, int error_line) {
  int line = 0, tabbed = -1;
  for (std::size_t start = 0; start <= text.size() && line <= error_line; ++line) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view row = text.substr(start, end - start);
    const std::size_t content = row.find_first_not_of(" \t");  // a blank line's tabs are no indentation
    if (content != std::string_view::npos && row.substr(0, content).find('\t') != std::string_view::npos) tabbed = line;
    start = end + 1;
  }
  if (tabbed < 0) return "";
  return " (line " + std::to_string(tabbed + 1) + " is indented with a tab: YAML indents with spaces only)";
}

/// Where `text` stops being UTF-8 (the only encoding fulgur reads YAML in), or npos.
std::size_t invalid_utf8_at(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = [&](std::size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
    const unsigned lead = byte(0);
    std::size_t length = 0;
    unsigned low = 0x80, high = 0xBF;  // the range of the first continuation byte (RFC 3629's table)
    if (lead < 0x80) length = 1;
    else if (lead >= 0xC2 && lead <= 0xDF) length = 2;
    else if (lead >= 0xE0 && lead <= 0xEF)  // no overlong form (E0), no surrogate (ED)
      length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
    else if (lead >= 0xF0 && lead <= 0xF4)  // no overlong form (F0), nothing past U+10FFFF (F4)
      length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
    else return i;
    for (std::size_t k = 1; k < length; ++k)
      if (byte(k) < (k == 1 ? low : 0x80) || byte(k) > (k == 1 ? high : 0xBF)) return i;
    i += length;
  }
  return std::string_view::npos;
}

std::string not_utf8(std::string_view text, std::size_t at) {
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[at])));
  return "is not UTF-8 text (byte " + std::string(byte) + " at offset " + std::to_string(at) +
         "); YAML configs and values are read as UTF-8: convert it (e.g. iconv -t UTF-8)";
}

std::string join_key(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::vector<std::string> split(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(key.substr(start, dot - start));
  parts.push_back(key.substr(start));
  return parts;
}

const ClassChoice* find_choice(const Schema& slot, std::string_view name) {
  for (const auto& choice : slot.choices)
    if (choice.matches(name)) return &choice;
  return nullptr;
}

std::string choice_names(const Schema& slot) {
  std::string out;
  for (const auto& choice : slot.choices) out += (out.empty() ? "" : ", ") + choice.name;
  return out;
}

YAML::Node class_entry(const ClassChoice& choice) {
  YAML::Node entry(YAML::NodeType::Map);
  entry["class_path"] = choice.name;
  YAML::Node args(YAML::NodeType::Map);
  for (const auto& arg : choice.init_args) args[arg.name] = defaults_of(arg);
  entry["init_args"] = args;
  return entry;
}

std::vector<std::string> init_arg_names(const ClassChoice& choice) {
  std::vector<std::string> names;
  for (const auto& arg : choice.init_args)
    for (auto& key : dotted_keys(arg, arg.kind == Schema::Kind::group ? arg.name : "")) names.push_back(key);
  for (const auto& arg : choice.init_args)
    if (arg.kind != Schema::Kind::group) names.push_back(arg.name);
  return names;
}

std::string unknown_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string text = "unknown key '" + key + "'";
  if (const std::string near = closest(key, candidates); !near.empty()) text += "; did you mean " + near + "?";
  return text;
}

}  // namespace

// ---- schema ---------------------------------------------------------------------------------------

const Schema* Schema::child(std::string_view key) const {
  for (const auto& c : children)
    if (c.name == key) return &c;
  return nullptr;
}
Schema* Schema::child(std::string_view key) {
  for (auto& c : children)
    if (c.name == key) return &c;
  return nullptr;
}

bool ClassChoice::matches(std::string_view given) const {
  if (given == name) return true;
  return std::find(aliases.begin(), aliases.end(), given) != aliases.end();
}

ConfigError::ConfigError(std::vector<std::string> found)
    : MisconfigurationError(join_lines(found)), problems(std::move(found)) {}

// ---- the config --------------------------------------------------------------------------------

YAML::Node defaults_of(const Schema& schema) {
  if (schema.kind == Schema::Kind::group) {
    YAML::Node map(YAML::NodeType::Map);
    for (const auto& c : schema.children) map[c.name] = defaults_of(c);
    return map;
  }
  return YAML::Clone(schema.default_value);
}

Config::Config(const Schema& root) : root_(&root), tree_(defaults_of(root)) {}

void Config::problem(const std::string& where, const std::string& text) {
  problems_.push_back(where.empty() ? text : where + ": " + text);
}

void Config::throw_if_problems() const {
  if (!problems_.empty()) throw ConfigError(problems_);
}

void Config::set(const std::string& key, const YAML::Node& value) {
  YAML::Node node = tree_;
  const auto parts = split(key);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) node.reset(node[parts[i]]);  // reset: rebinds (= would alias)
  node[parts.back()] = YAML::Clone(value);
}

void Config::read_environment(const std::string& prefix) {
  for (const std::string& key : dotted_keys(*root_)) {
    std::string name = prefix + "_";
    for (char c : key) name += c == '.' ? std::string("__") : std::string(1, static_cast<char>(std::toupper(c)));
    if (const char* text = std::getenv(name.c_str()))
      apply({Source::Kind::set, key, text, "environment variable " + name + "=" + text});
  }
}

void Config::apply(const Source& source) {
  if (source.kind == Source::Kind::file || source.kind == Source::Kind::text) {
    const bool text = source.kind == Source::Kind::text;
    const std::string name = text ? source.key : source.text;
    YAML::Node file;
    if (!text && std::filesystem::is_directory(source.text)) {
      problem("--config " + source.text, "is a directory; give a YAML file");
      return;
    }
    std::string content;
    if (text) {
      content = source.text;
    } else {
      std::ifstream in(source.text, std::ios::binary);
      if (in) content.assign(std::istreambuf_iterator<char>(in), {});
      if (!in && !in.eof()) {
        problem("--config " + source.text, "cannot read the file (" +
                                               (std::filesystem::exists(source.text) ? std::string("not readable")
                                                                                     : std::string("no such file")) +
                                               ")");
        return;
      }
    }
    // yaml-cpp takes other bytes as they come, and the printed config would not read back.
    if (const std::size_t at = invalid_utf8_at(content); at != std::string_view::npos) {
      problem(text ? name : "--config " + name, not_utf8(content, at));
      return;
    }
    try {
      file.reset(YAML::Load(content));
      // A second document ("---") would be dropped by YAML::Load without a word; PyYAML refuses it.
      if (const std::optional<YAML::Mark> second = second_document(content)) {
        problem(name + ":" + std::to_string(second->line + 1) + ":" + std::to_string(second->column + 1),
                "a second YAML document ('---') in one config file; fulgur reads one: merge them, or give each with "
                "its own --config");
        return;
      }
    } catch (const YAML::ParserException& e) {
      problem(name + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1),
              "YAML syntax error: " + e.msg + tab_indent_hint(content, e.mark.line));
      return;
    }
    if (is_null(file)) return;  // an empty file
    std::vector<std::pair<std::string, std::string>> duplicates;
    std::vector<YAML::Node> seen_nodes;
    find_duplicate_keys(file, name, "", duplicates, seen_nodes);
    for (const auto& [where, what] : duplicates) problem(where, what);  // and the file's other problems with them
    if (!file.IsMap()) {
      problem(where_in_file(name, file), "a config file is a mapping of keys (trainer:, model:, ...), got " +
                                             describe_given(file));
      return;
    }
    for (const auto& entry : file) {
      const std::string key = entry.first.Scalar();
      const Schema* child = root_->child(key);
      if (child == nullptr) {
        problem(where_in_file(name, entry.first), unknown_key(key, dotted_keys(*root_)));
        continue;
      }
      apply_node(tree_, key, *child, entry.second, key, name, false);
    }
    return;
  }
  if (const std::size_t at = invalid_utf8_at(source.text); at != std::string_view::npos) {
    problem(!source.origin.empty() ? source.origin : "--" + source.key, "the value " + not_utf8(source.text, at));
    return;
  }
  const std::string where = !source.origin.empty() ? source.origin
                            : "--" + source.key + (source.kind == Source::Kind::append ? "+=" : "=") + source.text;
  apply_dotted(source.key, source.text, where, source.kind == Source::Kind::append);
}

namespace {
/// A command-line value as the key reads it: YAML, or (a str key) the text itself.
YAML::Node value_of(const std::string& text, const Schema& schema) {
  if (schema.kind == Schema::Kind::value && schema.text != Schema::Text::yaml) {
    if (schema.text == Schema::Text::raw_or_null && is_null(YAML::Node(text))) return YAML::Node(YAML::NodeType::Null);
    return string_node(text);
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception&) {
    return YAML::Node(text);  // not YAML: the text itself
  }
}
}  // namespace

void Config::apply_dotted(const std::string& key, const std::string& text, const std::string& where, bool append) {
  const auto parts = split(key);
  const Schema* schema = root_;
  YAML::Node parent = tree_;
  std::string path;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (schema->kind != Schema::Kind::group) break;
    const Schema* child = schema->child(part);
    if (child == nullptr) {
      problem(where, unknown_key(key, dotted_keys(*root_)));
      return;
    }
    const std::string child_path = join_key(path, part);
    const bool last = i + 1 == parts.size();
    if (last || child->kind == Schema::Kind::group) {
      if (last) {
        if (append && child->kind != Schema::Kind::class_list) {
          problem(where, "'+=' appends to a list of classes (trainer.callbacks, trainer.logger); " + child_path +
                             " is not one: use '='.");
          return;
        }
        apply_node(parent, part, *child, value_of(text, *child), child_path, where, append);
        return;
      }
      parent.reset(parent[part]);
      schema = child;
      path = child_path;
      continue;
    }
    if (child->kind == Schema::Kind::value) {
      problem(where, unknown_key(key, dotted_keys(*root_)));
      return;
    }
    // A class slot with keys after it: an init_arg of its (last) class.
    std::vector<std::string> rest(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1, parts.end());
    if (rest.front() == "class_path" && rest.size() == 1) {
      apply_node(parent, part, *child, value_of(text, *child), child_path, where, append);
      return;
    }
    if (rest.front() == "init_args") rest.erase(rest.begin());
    if (rest.empty()) {
      problem(where, "give one init_arg: --" + child_path + ".init_args.NAME=VALUE");
      return;
    }
    YAML::Node slot = parent[part];
    YAML::Node entry = slot;
    if (child->kind == Schema::Kind::class_list) {
      if (!slot.IsSequence() || slot.size() == 0) {
        problem(where, child_path + " holds no class to set '" + rest.front() + "' on; add one first, e.g. --" +
                           child_path + "+=" + (child->choices.empty() ? "NAME" : child->choices.front().name));
        return;
      }
      entry.reset(slot[slot.size() - 1]);
    }
    const std::string class_name = entry["class_path"].Scalar();
    const ClassChoice* choice = find_choice(*child, class_name);
    std::string arg_key;
    for (const auto& r : rest) arg_key += (arg_key.empty() ? "" : ".") + r;
    YAML::Node args = entry["init_args"];
    const Schema* arg_schema = nullptr;
    if (choice != nullptr)
      for (const auto& a : choice->init_args)
        if (a.name == rest.front()) arg_schema = &a;
    if (arg_schema == nullptr) {
      const std::string text = choice != nullptr && choice->init_args.empty()
                                   ? class_name + " takes no init_args"
                                   : unknown_key(arg_key, choice ? init_arg_names(*choice) : std::vector<std::string>{});
      problem(where, child_path + " (" + class_name + "): " + text);
      return;
    }
    // Walk the rest inside the init_arg (a group of keys, e.g. a nested options struct).
    YAML::Node at = args;
    const Schema* s = arg_schema;
    std::string leaf = rest.front();
    for (std::size_t j = 1; j < rest.size(); ++j) {
      const Schema* next = s->kind == Schema::Kind::group ? s->child(rest[j]) : nullptr;
      if (next == nullptr) {
        problem(where, child_path + " (" + class_name + "): " + unknown_key(arg_key, init_arg_names(*choice)));
        return;
      }
      at.reset(at[leaf]);
      leaf = rest[j];
      s = next;
    }
    apply_node(at, leaf, *s, value_of(text, *s), child_path + ".init_args." + arg_key, where, false);
    return;
  }
  problem(where, unknown_key(key, dotted_keys(*root_)));
}

void Config::apply_node(YAML::Node parent, const std::string& key, const Schema& schema, const YAML::Node& given,
                        const std::string& path, const std::string& where_base, bool append) {
  // A file's nodes carry their line; an override's do not.
  const bool from_file = given.Mark().line >= 0 && !where_base.starts_with("--") && !where_base.starts_with("environment");
  const std::string where = from_file ? where_in_file(where_base, given) : where_base;
  switch (schema.kind) {
    case Schema::Kind::value: {
      if (const auto wrong = schema.check(given)) {
        const std::size_t said_after = wrong->find('\n');  // ValueCheck: a word for after the value given
        std::string text = path + ": expected " + wrong->substr(0, said_after) + ", got " + describe_given(given);
        if (said_after != std::string::npos) text += wrong->substr(said_after + 1);
        if (schema.type.starts_with("str") && (given.IsMap() || given.IsSequence()))
          text += " (in YAML, quote a text that starts with '{' or '[': \"{epoch}-{val_loss:.2f}\")";
        problem(where, text);
        return;
      }
      parent[key] = schema.normalize && !is_null(given) ? schema.normalize(given) : YAML::Clone(given);
      return;
    }
    case Schema::Kind::group: {
      if (is_null(given)) return;  // `trainer:` with its keys commented out: nothing to set
      if (!given.IsMap()) {
        problem(where, path + ": expected a mapping of its keys (" + path + ".KEY: VALUE), got " + describe_given(given));
        return;
      }
      YAML::Node node = parent[key];
      for (const auto& entry : given) {
        const std::string sub = entry.first.Scalar();
        const Schema* child = schema.child(sub);
        if (child == nullptr) {
          problem(from_file ? where_in_file(where_base, entry.first) : where,
                  unknown_key(join_key(path, sub), dotted_keys(*root_)));
          continue;
        }
        apply_node(node, sub, *child, entry.second, join_key(path, sub), where_base, false);
      }
      return;
    }
    case Schema::Kind::class_one:
    case Schema::Kind::class_list: {
      const bool list = schema.kind == Schema::Kind::class_list;
      // One entry given as a name or {class_path, init_args}, merged onto `current` when it is the same class.
      auto entry_of = [&](const YAML::Node& spec, YAML::Node current, const std::string& at) -> std::optional<YAML::Node> {
        const std::string where = from_file ? where_in_file(where_base, spec) : where_base;  // this item's line
        std::string name;
        bool has_args = false;
        std::vector<std::pair<YAML::Node, YAML::Node>> args_given;  // key and value nodes, with their file marks
        if (spec.IsScalar() && !is_null(spec)) {
          name = spec.Scalar();
        } else if (spec.IsMap()) {
          if (spec["class_path"]) name = spec["class_path"].Scalar();
          else if (current && current.IsMap()) name = current["class_path"].Scalar();
          has_args = true;
          for (const auto& e : spec) {
            const std::string k = e.first.Scalar();
            if (k == "class_path") continue;
            if (k == "init_args") {
              if (!e.second.IsMap() && !is_null(e.second)) {
                problem(where, at + ".init_args: expected a mapping, got " + describe_given(e.second));
                return std::nullopt;
              }
              if (e.second.IsMap())
                for (const auto& a : e.second) args_given.emplace_back(a.first, a.second);
            } else {
              args_given.emplace_back(e.first, e.second);
            }
          }
          if (name.empty()) {
            problem(where, at + ": give class_path (one of " + choice_names(schema) + ")");
            return std::nullopt;
          }
        } else {
          problem(where, at + ": expected a class name (one of " + choice_names(schema) +
                             ") or {class_path: NAME, init_args: {...}}, got " + describe_given(spec));
          return std::nullopt;
        }
        const ClassChoice* choice = find_choice(schema, name);
        if (choice == nullptr) {
          std::vector<std::string> names;
          for (const auto& c : schema.choices) names.push_back(c.name);
          std::string text = at + ": '" + name + "' is not a class this program compiled for it; it takes " +
                             choice_names(schema);
          if (const std::string near = closest(name, names); !near.empty()) text += " (did you mean " + near + "?)";
          if (!schema.unknown_hint.empty()) text += ". " + schema.unknown_hint;
          problem(where, text);
          return std::nullopt;
        }
        YAML::Node entry = current && current.IsMap() && current["class_path"] && choice->matches(current["class_path"].Scalar())
                               ? YAML::Clone(current)
                               : class_entry(*choice);
        if (has_args) {
          YAML::Node args = entry["init_args"];
          for (const auto& a : args_given) {
            const std::string arg = a.first.Scalar();
            const Schema* arg_schema = nullptr;
            for (const auto& s : choice->init_args)
              if (s.name == arg) arg_schema = &s;
            if (arg_schema == nullptr) {
              std::vector<std::string> candidates = init_arg_names(*choice);
              candidates.insert(candidates.end(), {"class_path", "init_args"});
              problem(from_file ? where_in_file(where_base, a.first) : where,
                      at + " (" + choice->name + "): " +
                          (choice->init_args.empty() ? choice->name + " takes no init_args"
                                                     : unknown_key(arg, candidates)));
              continue;
            }
            apply_node(args, arg, *arg_schema, a.second, at + ".init_args." + arg, where_base, false);
          }
        }
        return entry;
      };
      if (!list) {
        if (auto entry = entry_of(given, parent[key], path)) parent[key] = *entry;
        return;
      }
      YAML::Node items(YAML::NodeType::Sequence);
      if (append && parent[key].IsSequence())
        for (const auto& e : parent[key]) items.push_back(YAML::Clone(e));
      if (is_null(given) && !append) {  // null: the default (Lightning's `logger: null` is its default logger)
        parent[key] = schema.takes_bool ? YAML::Clone(schema.default_value) : items;
        return;
      }
      if (schema.takes_bool && !append)
        if (const auto flag = as_bool(given)) {
          parent[key] = *flag ? YAML::Clone(schema.default_value) : items;
          return;
        }
      if (given.IsSequence()) {
        const std::size_t first = items.size();
        for (std::size_t i = 0; i < given.size(); ++i)
          if (auto entry = entry_of(given[i], YAML::Node(), path + "[" + std::to_string(first + i) + "]"))
            items.push_back(*entry);
      } else if (auto entry = entry_of(given, YAML::Node(), path + "[" + std::to_string(items.size()) + "]")) {
        items.push_back(*entry);
      }
      parent[key] = items;
      return;
    }
  }
}

// ---- names ---------------------------------------------------------------------------------------

std::vector<std::string> dotted_keys(const Schema& schema, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const auto& c : schema.children) {
    const std::string key = join_key(prefix, c.name);
    if (c.kind == Schema::Kind::group)
      for (auto& k : dotted_keys(c, key)) keys.push_back(std::move(k));
    else
      keys.push_back(key);
  }
  return keys;
}


void check_ckpt_path(const YAML::Node& ckpt_path, const TrainerConfig& trainer) {
  if (is_null(ckpt_path) || !ckpt_path.IsScalar()) return;
  const std::string& path = ckpt_path.Scalar();
  if (path.empty() || path == "last" || path == "best" || path == "hpc" || fulgur::detail::path_exists(path)) return;
  std::string looked = fulgur::detail::absolute_path(path);
  if (path.front() != '/' && !trainer.default_root_dir.empty()) {  // "": the Trainer refuses it
    const std::string under = fulgur::detail::resolve_path(trainer, path);  // where fit looks next
    if (fulgur::detail::path_exists(under)) return;
    if (under != path) looked += " and " + fulgur::detail::absolute_path(under);
  }
  throw ConfigError({"ckpt_path=" + path + ": no such checkpoint (looked at " + looked +
                     "); give an existing checkpoint file, or last, best or hpc"});
}

}  // namespace fulgur::cli
