// The data files compiled into the binary (docs/config.md, "General rules"): the default
// training config (configs/default.json), the model files (models/*.json) and the device presets
// (configs/devices/*.json), so `memsim run` works from any directory and after `cmake --install`.
// The table is generated at build time from the source tree (src/config/embed_files.cmake); the
// texts are the files' bytes, unmodified. Paths are relative to the source root, '/'-separated.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memsim::config {

struct EmbeddedFile {
  std::string_view path;  // e.g. "models/llama2-7b.json"
  std::string_view text;
};

// Every embedded file, sorted by path. Defined in the generated embedded_data.cc.
std::span<const EmbeddedFile> EmbeddedFiles();

// The text of the embedded file at `path` (relative, e.g. "configs/devices/h100-80g.json"; "./"
// and "dir/../" segments are normalised first), or nullptr when there is none.
const std::string_view* FindEmbedded(std::string_view path);

// Names of the embedded device presets ("a100-80g", ...), sorted.
std::vector<std::string> EmbeddedDeviceNames();

// Path prefix that marks a file as embedded in Setup::config_path and in error messages:
// "<embedded>/configs/default.json".
inline constexpr std::string_view kEmbeddedPrefix = "<embedded>/";

}  // namespace memsim::config
