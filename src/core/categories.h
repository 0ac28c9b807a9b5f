// Phases of a training run and categories of device memory: the shared vocabulary of
// workload/, engine/, timeline/, report/ and profile/ (docs/glossary.md).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace memsim {

// kUnknown only appears in imported profiles that carry no phase markers.
enum class Phase : std::uint8_t { kInit, kForward, kBackward, kOptimizerStep, kUnknown };

// docs/interfaces.md, 'Categories'.
enum class Category : std::uint8_t {
  kParameters,
  kGradients,
  kMainParameters,
  kOptimizerStates,
  kActivations,
  kTemporaries,
  kCommunication,
  kWorkspace,
  kOther,
};
inline constexpr int kNumCategories = 9;

// Bytes per category, indexed by static_cast<int>(Category).
using CategoryBytes = std::array<std::int64_t, kNumCategories>;

// The names used in JSON, CSV and the terminal: "init", "forward", "backward",
// "optimizer_step", "unknown" / "parameters", "gradients", ...
std::string_view PhaseName(Phase phase);
std::string_view CategoryName(Category category);
std::optional<Phase> PhaseFromName(std::string_view name);

}  // namespace memsim
