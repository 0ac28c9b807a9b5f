// Small formatting and output helpers shared by the reporters. Sizes are printed in GiB / MiB
// (powers of two: MiB = 2^20, GiB = 2^30).
#pragma once

#include <string>
#include <string_view>

#include "core/units.h"

namespace memsim::report {

// "12.34" (GiB with two decimals), sign kept for negative values.
std::string GiB(Bytes bytes);
// "+1.25" / "-0.50" / "0.00": a change in GiB with an explicit sign.
std::string SignedGiB(Bytes bytes);
// A change with an explicit sign in the unit that suits it: "+6.28 GiB", "-3.0 MiB", "0 B".
std::string SignedHuman(Bytes bytes);
// "1234.56" (MiB with two decimals).
std::string MiB(Bytes bytes);
// Human size picking the unit: "512 B", "3.0 MiB", "12.34 GiB".
std::string HumanBytes(Bytes bytes);

// Writes `content` to `path` via a temporary file in the same directory and a rename, so no
// half-written file is ever left behind. "-" writes to standard output. Throws InputError
// naming the path when the file cannot be written.
void WriteFileAtomically(const std::string& path, std::string_view content);

}  // namespace memsim::report
