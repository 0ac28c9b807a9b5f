#include "profile/clock.h"

#include <array>
#include <cctype>
#include <cstdint>

namespace memsim::profile::internal {
namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant, "chrono-compatible low-level
// date algorithms", days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// Reads exactly n digits at *p.
bool Digits(std::string_view s, size_t* p, size_t n, int64_t* out) {
  if (*p + n > s.size()) return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[*p + i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *p += n;
  *out = v;
  return true;
}

// HH:MM:SS[.fraction] at *p; returns ns since midnight.
bool TimeOfDay(std::string_view s, size_t* p, int64_t* ns) {
  int64_t h, m, sec;
  if (!Digits(s, p, 2, &h) || *p >= s.size() || s[(*p)++] != ':' || !Digits(s, p, 2, &m) ||
      *p >= s.size() || s[(*p)++] != ':' || !Digits(s, p, 2, &sec)) {
    return false;
  }
  if (h > 23 || m > 59 || sec > 60) return false;
  int64_t frac_ns = 0;
  if (*p < s.size() && (s[*p] == '.' || s[*p] == ',')) {
    ++*p;
    int64_t scale = 100'000'000;
    size_t digits = 0;
    while (*p < s.size() && std::isdigit(static_cast<unsigned char>(s[*p]))) {
      if (scale > 0) frac_ns += (s[*p] - '0') * scale;
      scale /= 10;
      ++*p;
      ++digits;
    }
    if (digits == 0) return false;
  }
  *ns = ((h * 60 + m) * 60 + sec) * 1'000'000'000 + frac_ns;
  return true;
}

bool ValidDate(int64_t mo, int64_t d) { return mo >= 1 && mo <= 12 && d >= 1 && d <= 31; }

// Accepts what may follow a time: nothing, a zone ("Z", "+08:00", "UTC", "CST").
bool ZoneOnly(std::string_view rest) {
  rest = Trim(rest);
  for (char c : rest) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != ':') {
      return false;
    }
  }
  return rest.size() <= 6;
}

// A date and a time of day to ns since the epoch; nullopt beyond kMaxAbsTimeNs (about the years
// 1824 to 2116; core/checked.h).
std::optional<TimeNs> DateTimeNs(int64_t days, int64_t time_of_day_ns) {
  const std::optional<TimeNs> midnight = ToTimeNs(days, 86'400'000'000'000);
  return midnight ? AddTimeNs(*midnight, time_of_day_ns) : std::nullopt;
}

}  // namespace

std::optional<TimeNs> ParseWallClock(std::string_view text) {
  const std::string_view s = Trim(text);
  size_t p = 0;
  int64_t y, mo, d, tod;
  // YYYY/MM/DD or YYYY-MM-DD, then ' ' or 'T', then the time.
  if (Digits(s, &p, 4, &y) && p < s.size() && (s[p] == '/' || s[p] == '-')) {
    const char sep = s[p++];
    if (!Digits(s, &p, 2, &mo) || p >= s.size() || s[p++] != sep || !Digits(s, &p, 2, &d) ||
        !ValidDate(mo, d) || p >= s.size() || (s[p] != ' ' && s[p] != 'T')) {
      return std::nullopt;
    }
    ++p;
    if (!TimeOfDay(s, &p, &tod) || !ZoneOnly(s.substr(p))) return std::nullopt;
    return DateTimeNs(DaysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)), tod);
  }
  // `date`: "Sun Nov 29 19:35:01 UTC 2026" (the zone is optional).
  static constexpr std::array<std::string_view, 12> kMonths = {
      "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  if (s.size() > 20 && std::isalpha(static_cast<unsigned char>(s[0])) && s[3] == ' ') {
    const std::string_view month = s.substr(4, 3);
    mo = 0;
    for (size_t i = 0; i < kMonths.size(); ++i) {
      if (kMonths[i] == month) mo = static_cast<int64_t>(i) + 1;
    }
    if (mo == 0) return std::nullopt;
    p = 7;
    while (p < s.size() && s[p] == ' ') ++p;
    size_t day_end = p;
    while (day_end < s.size() && std::isdigit(static_cast<unsigned char>(s[day_end]))) ++day_end;
    auto day = ParseInt(s.substr(p, day_end - p));
    if (!day || !ValidDate(mo, *day) || day_end >= s.size() || s[day_end] != ' ') {
      return std::nullopt;
    }
    p = day_end + 1;
    if (!TimeOfDay(s, &p, &tod)) return std::nullopt;
    const size_t last_space = s.rfind(' ');
    auto year = ParseInt(s.substr(last_space + 1));
    if (!year || *year < 1970 || *year > 9999 || !ZoneOnly(s.substr(p, last_space - p))) {
      return std::nullopt;
    }
    return DateTimeNs(DaysFromCivil(*year, static_cast<unsigned>(mo), static_cast<unsigned>(*day)),
                      tod);
  }
  // Epoch seconds: at least 9 integer digits, so a stray number is not taken for a time.
  const size_t dot = s.find('.');
  if (s.substr(0, dot).size() >= 9) {
    auto us = ParseMicrosToNs(s);  // seconds read as "us" -> value x 1000; scale below
    if (us && *us >= 0) return ToTimeNs(*us, 1'000'000);
  }
  return std::nullopt;
}

}  // namespace memsim::profile::internal
