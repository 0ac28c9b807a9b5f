#include "core/categories.h"

namespace memsim {
namespace {

constexpr std::array<std::string_view, 5> kPhaseNames = {"init", "forward", "backward",
                                                         "optimizer_step", "unknown"};
constexpr std::array<std::string_view, kNumCategories> kCategoryNames = {
    "parameters",  "gradients",     "main_parameters", "optimizer_states", "activations",
    "temporaries", "communication", "workspace",       "other"};

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
