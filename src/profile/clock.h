// Internal to profile/: wall-clock text to nanoseconds. The tools print local time without a
// zone (docs/profile-formats.md, 'nvidia-smi CSV'), so times are read as if UTC: only differences
// matter to a Timeline.
#pragma once

#include <optional>
#include <string_view>

#include "profile/reader.h"

namespace memsim::profile::internal {

// "YYYY/MM/DD HH:MM:SS[.fff]" or "YYYY-MM-DD[T ]HH:MM:SS[.fff]" (nvidia-smi, ISO 8601 / `date
// --iso-8601`), a trailing zone ("Z", "+08:00", " UTC") ignored; `date`'s default "Www Mmm DD
// HH:MM:SS [ZONE] YYYY"; or plain epoch seconds with optional decimals ("1751500000.25").
// nullopt for anything else and for times beyond kMaxAbsTimeNs (core/checked.h).
std::optional<TimeNs> ParseWallClock(std::string_view text);

}  // namespace memsim::profile::internal
