// JSON Pointer (RFC 6901) construction, shared by every reader that names a field in its
// messages (config/, replay/, profile/). Header-only, no JSON library.
#pragma once

#include <string>
#include <string_view>

namespace memsim {

// `key` escaped as one reference token of a JSON Pointer: '~' -> "~0", '/' -> "~1".
inline std::string EscapePointerToken(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// The pointer of member `key` of the value at `pointer`: pointer + "/" + escaped key.
inline std::string ChildPointer(const std::string& pointer, std::string_view key) {
  return pointer + "/" + EscapePointerToken(key);
}

}  // namespace memsim
