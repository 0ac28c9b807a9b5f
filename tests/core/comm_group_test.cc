// The communicator-group table (core/comm_group.h): one row per group the workload emits, looked
// up by memsim's name and by Megatron's get_nccl_options names.
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "core/comm_group.h"

namespace memsim {
namespace {

TEST_CASE("communicator groups: names are unique and round-trip", "[core]") {
  std::set<std::string_view> names;
  for (const CommGroupInfo& row : kCommGroupTable) {
    CHECK(names.insert(row.name).second);
    CHECK(CommGroupName(row.group) == row.name);
    CHECK(CommGroupFromName(row.name) == row.group);
  }
  CHECK(names.size() == static_cast<size_t>(kNumCommGroups));
  CHECK_FALSE(CommGroupFromName("cp2").has_value());
}

TEST_CASE("communicator groups: a per-group buffer key names a group made with get_nccl_options",
          "[core]") {
  // memsim's names, Megatron-core main's pg_names and the older expert ones
  // (parallel_state.py: 'ep_tp', 'ep_dp'; before MoE parallel folding 'exp', 'dp_modulo_exp').
  CHECK(CommGroupForBufferKey("tp") == CommGroup::kTp);
  CHECK(CommGroupForBufferKey("dp_cp") == CommGroup::kDpCp);
  CHECK(CommGroupForBufferKey("ep") == CommGroup::kEp);
  CHECK(CommGroupForBufferKey("exp") == CommGroup::kEp);
  CHECK(CommGroupForBufferKey("etp") == CommGroup::kEtp);
  CHECK(CommGroupForBufferKey("ep_tp") == CommGroup::kEtp);
  CHECK(CommGroupForBufferKey("edp") == CommGroup::kEdp);
  CHECK(CommGroupForBufferKey("ep_dp") == CommGroup::kEdp);
  CHECK(CommGroupForBufferKey("dp_modulo_exp") == CommGroup::kEdp);
  // The world is made by init_process_group, without pg_options; "tp_exp" is Megatron's
  // tensor-and-expert group, on which memsim runs no collective.
  CHECK_FALSE(CommGroupForBufferKey("world").has_value());
  CHECK_FALSE(CommGroupForBufferKey("tp_exp").has_value());
  CHECK_FALSE(CommGroupForBufferKey("").has_value());
  CHECK(BufferKeyNames() == "tp, pp, cp, dp, dp_cp, mp, embd, ep, etp and edp");
}

}  // namespace
}  // namespace memsim
