#pragma once
// The little JSON MLFlowLogger needs: requests are written with json_string/json_number; answers
// are parsed into a Json tree whose fields are looked up by path (error_code, run.info.run_id).
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fulgur::loggers::mlflow {

struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  std::string text;  ///< a string's value, a number's or a boolean's text
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  /// The value at a dotted path of object fields ("run.info.run_id"); nullptr when absent.
  const Json* find(std::string_view path) const;
  /// The string at `path`, or "" when it is absent or not a string.
  std::string string_at(std::string_view path) const;
};

/// nullopt when `text` is not JSON.
std::optional<Json> parse_json(std::string_view text);
/// "text" with JSON's escapes.
std::string json_string(std::string_view text);
/// A double as JSON: shortest digits that read back the same; "NaN", "Infinity", "-Infinity" as the
/// strings protobuf's JSON reader (MLflow's server) takes for them.
std::string json_number(double value);

}  // namespace fulgur::loggers::mlflow
