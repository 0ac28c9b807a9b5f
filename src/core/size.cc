#include "core/size.h"

#include <charconv>
#include <cstdint>
#include <limits>

#include <fmt/core.h>

#include "core/error.h"

namespace memsim {
namespace {

struct Unit {
  std::string_view suffix;
  Bytes factor;
};

constexpr Unit kUnits[] = {
    {"B", 1},
    {"KiB", kKiB},
    {"MiB", kMiB},
    {"GiB", kGiB},
    {"TiB", kGiB * 1024},
    {"KB", 1000},
    {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000},
    {"TB", Bytes{1000} * 1000 * 1000 * 1000},
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Bytes ParseSize(std::string_view text, std::string_view what) {
  const std::string_view s = Trim(text);
  auto bad = [&]() {
    return InputError(fmt::format(
        "{}: expected a size such as 80GiB (an integer with an optional unit B, KiB, MiB, GiB, "
        "TiB, KB, MB, GB or TB), got '{}'",
        what, text));
  };
  std::size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) throw bad();
  std::uint64_t number = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + digits, number);
  const std::string_view suffix = Trim(s.substr(digits));
  Bytes factor = 1;
  if (!suffix.empty()) {
    bool found = false;
    for (const Unit& u : kUnits) {
      if (u.suffix == suffix) {
        factor = u.factor;
        found = true;
      }
    }
    if (!found) throw bad();
  }
  const auto max = static_cast<std::uint64_t>(std::numeric_limits<Bytes>::max());
  if (ec == std::errc::result_out_of_range || number > max / static_cast<std::uint64_t>(factor)) {
    throw InputError(fmt::format("{}: size '{}' is too large", what, text));
  }
  (void)ptr;
  return static_cast<Bytes>(number) * factor;
}

}  // namespace memsim
