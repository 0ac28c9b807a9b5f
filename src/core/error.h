// InputError: bad user input (config, profile, trace, command line). Thrown only inside the
// boundary modules (config/, profile/, cli/, the trace readers) and caught in cli/, which prints
// what() once and exits 2. The message already names the file and the field (JSON pointer or
// line) and says what was expected.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace memsim {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// Thrown for input memsim recognises but does not model yet; message starts "unsupported: ".
class UnsupportedError : public InputError {
 public:
  explicit UnsupportedError(const std::string& what) : InputError("unsupported: " + what) {}
};

// The candidate closest to `word` by edit distance (a swap of two adjacent letters is one edit),
// or "" when none is within max(1, |word|/3) edits (a 3-letter word allows one). Used for "did
// you mean" suggestions.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace memsim
