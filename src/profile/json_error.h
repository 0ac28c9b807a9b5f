// Internal to profile/: turns an nlohmann parse error into memsim's "<file>: byte <offset>: ..."
// message (nlohmann stays inside profile/).
#pragma once

#include <string>
#include <string_view>

#include <fmt/core.h>

namespace memsim::profile::internal {

// `what` is nlohmann's message ("[json.exception.parse_error.101] parse error at line 1,
// column 9: syntax error while parsing value - unexpected end of input; expected ..."): keep
// the part after the position.
// `position` is nlohmann's 1-based count of bytes read; the message gives the 0-based offset
// of the offending byte (the file size when the input ended early).
inline std::string JsonErrorMessage(const std::string& path, size_t position,
                                    std::string_view what, std::string_view expected) {
  const size_t byte = position > 0 ? position - 1 : 0;
  const size_t colon = what.find(": ", what.find("column"));
  std::string_view detail = colon == std::string_view::npos ? what : what.substr(colon + 2);
  if (detail.find("unexpected end of input") != std::string_view::npos) {
    return fmt::format("{}: byte {}: truncated JSON (unexpected end of input), expected {}", path,
                       byte, expected);
  }
  return fmt::format("{}: byte {}: invalid JSON ({}), expected {}", path, byte, detail, expected);
}

}  // namespace memsim::profile::internal
