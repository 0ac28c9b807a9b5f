#include "core/categories.h"

namespace memsim {
namespace {

// In enum order; sized by their initializers, so a name missing for an enumerator fails to build.
constexpr auto kPhaseNames = std::to_array<std::string_view>(
    {"init", "forward", "backward", "optimizer_step", "unknown"});
constexpr auto kCategoryNames = std::to_array<std::string_view>(
    {"parameters", "gradients", "main_parameters", "optimizer_states", "activations",
     "temporaries", "communication", "workspace", "other"});
static_assert(kPhaseNames.size() == static_cast<size_t>(Phase::kUnknown) + 1);
static_assert(kCategoryNames.size() == kNumCategories &&
              kCategoryNames.size() == static_cast<size_t>(Category::kOther) + 1);

}  // namespace

std::string_view PhaseName(Phase phase) { return kPhaseNames[static_cast<int>(phase)]; }

std::string_view CategoryName(Category category) {
  return kCategoryNames[static_cast<int>(category)];
}

std::optional<Phase> PhaseFromName(std::string_view name) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (kPhaseNames[i] == name) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

}  // namespace memsim
