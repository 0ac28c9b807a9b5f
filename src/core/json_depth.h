// How deep JSON text nests, found without parsing it: shared by the readers that refuse
// documents nested deeper than the files they read ever are (config/: 64 levels; replay/ and
// profile/: memory snapshots). Header-only, no JSON library.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace memsim {

// The byte offset of the '[' or '{' that opens level `max_depth` + 1 of `text` (the outermost
// container is level 1; brackets inside strings are skipped, escapes honoured), or nullopt when
// `text` nests no deeper. Linear, no allocation; `text` may be a prefix of the document.
inline std::optional<std::size_t> FindJsonTooDeep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace memsim
