// The flag classification table (megatron_flags.h).
#include "config/megatron_flags.h"

#include <algorithm>

namespace memsim::config {
namespace {

constexpr FlagInfo kFlags[] = {
#include "config/megatron_flag_table.inc"
};

}  // namespace

const FlagInfo* FindFlag(std::string_view flag) {
  const auto it = std::lower_bound(std::begin(kFlags), std::end(kFlags), flag,
                                   [](const FlagInfo& f, std::string_view x) { return f.flag < x; });
  return it != std::end(kFlags) && it->flag == flag ? &*it : nullptr;
}

std::span<const FlagInfo> AllFlags() { return kFlags; }

}  // namespace memsim::config
