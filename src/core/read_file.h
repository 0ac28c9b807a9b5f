// Reading a whole input file (a config, a baseline report, a launch script) with a bound on its
// size, so that an endless or huge file (/dev/zero, a log given by mistake) is refused with a
// message instead of filling memory. Pipes and devices work; a directory is not a file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace memsim {

// The text of `path`, or std::nullopt when it is a directory or cannot be opened. Throws
// InputError "<path>: larger than memsim's limit of <max_bytes> bytes (<MiB> MiB) for <what>"
// once more than `max_bytes` bytes have been read, and InputError "<path>: binary data (a NUL
// byte at byte <offset>), not <what>" when one of the first 4096 bytes is NUL (no text memsim
// reads starts so; /dev/zero stops at once). The path is echoed through `label`, the caller's
// printable form of it. REQUIRES: max_bytes > 0.
std::optional<std::string> ReadBoundedFile(const std::string& path, std::string_view label,
                                           std::int64_t max_bytes, std::string_view what);

// Why `path` could not be read, for a message: "a directory, not a file", or the C library's
// reason for not opening it ("No such file or directory").
std::string WhyUnreadable(const std::string& path);

}  // namespace memsim
