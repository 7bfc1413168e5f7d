#include "store.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "fulgur/errors.hpp"

namespace fulgur::loggers::mlflow {
namespace {

const std::string supported =
    "use http://host:port (an `mlflow server`), https://..., file:<folder> or a folder path (MLflow's file store)";

/// The scheme of "scheme:rest" (letters, digits, '+', '-', '.'; two characters at least, so that a
/// Windows drive letter is not one); empty when there is none.
std::string scheme_of(const std::string& uri) {
  const std::size_t colon = uri.find(':');
  if (colon == std::string::npos || colon < 2) return {};
  for (std::size_t i = 0; i < colon; ++i) {
    const char c = uri[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!letter && (i == 0 || !((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'))) return {};
  }
  return uri.substr(0, colon);
}

/// "host:port" or "host:port/path" (no scheme): a server's address written without http://, which
/// would otherwise be taken for a scheme (localhost:5000) or a folder (127.0.0.1:5000).
bool looks_like_host_port(const std::string& uri) {
  const std::size_t colon = uri.find(':');
  if (colon == std::string::npos || colon == 0 || uri.find('/') < colon) return false;
  std::size_t end = colon + 1;
  while (end < uri.size() && uri[end] >= '0' && uri[end] <= '9') ++end;
  return end > colon + 1 && (end == uri.size() || uri[end] == '/');
}

std::string file_uri_path(const std::string& uri) {
  std::string path = uri.substr(5);  // after "file:"
  if (path.rfind("//", 0) == 0) {    // file://[localhost]/absolute
    path = path.substr(2);
    if (path.rfind("localhost/", 0) == 0) path = path.substr(9);
    if (path.empty() || path.front() != '/')
      throw MisconfigurationError("fulgur: MLFlowLogger: the tracking URI '" + uri +
                                  "' names a host (file://<host>/...); a file store is local: write file:///absolute/path, "
                                  "file:relative/path or the path alone.");
  }
  return path;
}

}  // namespace

std::unique_ptr<Store> make_store(const std::string& uri, std::chrono::duration<double> request_timeout) {
  if (uri.empty()) throw MisconfigurationError("fulgur: MLFlowLogger: the tracking URI is empty; " + supported + ".");
  if (looks_like_host_port(uri))
    throw MisconfigurationError("fulgur: MLFlowLogger: the tracking URI '" + uri +
                                "' reads as a server's host:port without its scheme; did you mean http://" + uri +
                                "? (A file store's folder cannot be named host:port.)");
  const std::string scheme = scheme_of(uri);
  if (scheme == "http" || scheme == "https") {
    const std::string rest = uri.substr(scheme.size() + 1);
    const std::size_t host_end = rest.find('/', 2);
    const std::string host = rest.rfind("//", 0) == 0 ? rest.substr(2, host_end == std::string::npos ? host_end : host_end - 2)
                                                       : std::string();
    if (host.empty() || host.front() == ':' || host.find_first_of(" \t\r\n") != std::string::npos)
      throw MisconfigurationError("fulgur: MLFlowLogger: the tracking URI '" + uri + "' has no host (" + scheme +
                                  "://host:port expected); " + supported + ".");
    std::string base = uri;
    while (!base.empty() && base.back() == '/') base.pop_back();
    return make_rest_store(base, request_timeout);
  }
  if (scheme == "file") return make_file_store(file_uri_path(uri), uri);
  if (!scheme.empty())
    throw MisconfigurationError("fulgur: MLFlowLogger: the tracking URI '" + uri + "' has the scheme '" + scheme +
                                "', which fulgur cannot log to; " + supported +
                                ". (Database and Databricks URIs are for MLflow's Python client: run `mlflow server "
                                "--backend-store-uri <it>` and give fulgur the server's address.)");
  return make_file_store(uri, uri);
}

bool valid_key(std::string_view key) {
  if (key.empty() || key.size() > 250) return false;
  for (const char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("_-. :/").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  // posixpath.normpath(key) must be the key itself: no leading or trailing '/', no "//", no "." or
  // ".." component (a key is a file's path in the file store).
  if (key.front() == '/' || key.back() == '/') return false;
  std::size_t start = 0;
  while (start <= key.size()) {
    const std::size_t end = std::min(key.find('/', start), key.size());
    const std::string_view part = key.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that read back; exponent form when the decimal point would
  // sit more than 16 places right or 4 places left of the first digit (float_repr_style 'r').
  char buffer[40];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string sci(buffer, end);  // [-]d[.ddd]e[+-]xx
  const bool negative = sci.front() == '-';
  if (negative) sci.erase(0, 1);
  const std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // digits before the decimal point
  std::string out;
  if (point > 16 || point < -3) {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : std::string()) + "e" +
          (exponent < 0 ? "-" : "+") + (std::abs(exponent) < 10 ? "0" : "") + std::to_string(std::abs(exponent));
  } else if (point <= 0) {
    out = "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
  } else if (static_cast<std::size_t>(point) >= digits.size()) {
    out = digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<std::size_t>(point)) + "." + digits.substr(static_cast<std::size_t>(point));
  }
  return negative ? "-" + out : out;
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace fulgur::loggers::mlflow
