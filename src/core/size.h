// Byte sizes written by people: "80GiB", "512MiB", "4096", "1.5GiB" is NOT accepted (integers
// only). Binary units B, KiB, MiB, GiB, TiB (powers of 2) and decimal KB, MB, GB, TB (powers
// of 10), as docs/interfaces.md, 'Command line', says. Used by --capacity and other size options.
#pragma once

#include <string_view>

#include "core/units.h"

namespace memsim {

// Parses a non-negative integer with an optional unit suffix (spaces between number and unit
// allowed). Throws InputError "<what>: expected a size such as 80GiB (...), got '<text>'" for
// anything else, or "<what>: size '<text>' is too large" beyond 2^63 - 1 bytes.
Bytes ParseSize(std::string_view text, std::string_view what);

}  // namespace memsim
