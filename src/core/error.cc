#include "core/error.h"

#include <algorithm>
#include <cctype>

namespace memsim {
namespace {

// Edit distance, case-insensitive: insertions, deletions, substitutions and transpositions of two
// adjacent characters cost 1 each (optimal string alignment distance; Damerau 1964 counts a
// transposition as one error, the commonest typo after a wrong letter). Three rows.
size_t EditDistance(std::string_view a, std::string_view b) {
  auto same = [&](size_t i, size_t j) {  // a[i] == b[j], case-insensitive
    return std::tolower(static_cast<unsigned char>(a[i])) ==
           std::tolower(static_cast<unsigned char>(b[j]));
  };
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same(i - 1, j - 1) ? 0 : 1)});
      if (i > 1 && j > 1 && same(i - 1, j - 2) && same(i - 2, j - 1)) {
        cur[j] = std::min(cur[j], before[j - 2] + 1);
      }
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  // Short words get few edits: with max(2, ...) the unrelated "foo" matched "fp8" (2 edits); a
  // swapped pair ("rnu" for "run") is one edit, so short typos still get their suggestion.
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace memsim
