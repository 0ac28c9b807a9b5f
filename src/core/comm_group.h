// Communicator groups, declared once (style.md rule 9): the process groups memsim's workload runs
// collectives on, each with the Megatron-core process group it stands for and the name Megatron
// gives it in get_nccl_options (megatron/core/parallel_state.py initialize_model_parallel), which
// is also the key of MindSpeed's --hccl-group-buffer. The workload emits collectives by CommGroup
// (workload/emitter.h), the device model makes one communicator per group it sees
// (device/communicators.h), and the training reader accepts a per-group HCCL buffer size for
// exactly the groups of this table that Megatron creates with get_nccl_options
// (config/training.cc; docs/config.md, hccl_group_buffer).
// Not modelled: Megatron's other groups (tp_dp, tp_cp, tp_dp_cp, pos_embd, hcp, intra_dp_cp,
// tp_ep_mp, ...), which memsim runs no collective on, and MindSpeed's own (cp2, cp_ring, ...).
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

namespace memsim {

enum class CommGroup : std::uint8_t {
  kWorld,
  kTp,
  kPp,
  kCp,
  kDp,
  kDpCp,
  kMp,
  kEmbd,
  kEp,
  kEtp,
  kEdp,
};

struct CommGroupInfo {
  CommGroup group;
  // memsim's name: Op::collective_group in dump-program, `explain`'s communicator lines, and the
  // key of training.hccl_group_buffer.
  std::string_view name;
  // The parallel_state.py global (or torch.distributed's default group) the group stands for.
  std::string_view megatron_group;
  // get_nccl_options' pg_name at Megatron-core main; "" for a group made without it.
  std::string_view nccl_options;
  // The pg_name of releases before MoE parallel folding, where it differed ("" otherwise).
  std::string_view older_nccl_options;
};

// Rows in CommGroup order. Megatron-core parallel_state.py initialize_model_parallel at main:
// create_group(..., pg_options=get_nccl_options('<pg_name>', nccl_comm_cfgs)) for every group
// but the world. Before MoE parallel folding (Megatron-core 0.10) the expert groups were
// new_group(..., pg_options=get_nccl_options('exp', ...)) for _EXPERT_MODEL_PARALLEL_GROUP and
// 'dp_modulo_exp' for _DATA_MODULO_EXPERT_PARALLEL_GROUP, with no expert tensor-parallel group
// ('tp_exp' is the tensor-and-expert group, on which memsim runs no collective). MindSpeed's
// --hccl-group-buffer takes these names (mindspeed/core/hccl_buffer/hccl_adaptive_func.py
// parse_hccl_buffer_string, allowed_keys).
inline constexpr CommGroupInfo kCommGroupTable[] = {
    // torch.distributed.init_process_group (megatron/training/initialize.py
    // _initialize_distributed): the default group, no pg_options.
    {CommGroup::kWorld, "world", "the default process group (WORLD)", "", ""},
    {CommGroup::kTp, "tp", "_TENSOR_MODEL_PARALLEL_GROUP", "tp", ""},
    {CommGroup::kPp, "pp", "_PIPELINE_MODEL_PARALLEL_GROUP", "pp", ""},
    {CommGroup::kCp, "cp", "_CONTEXT_PARALLEL_GROUP", "cp", ""},
    {CommGroup::kDp, "dp", "_DATA_PARALLEL_GROUP", "dp", ""},
    {CommGroup::kDpCp, "dp_cp", "_DATA_PARALLEL_GROUP_WITH_CP", "dp_cp", ""},
    {CommGroup::kMp, "mp", "_MODEL_PARALLEL_GROUP", "mp", ""},
    {CommGroup::kEmbd, "embd", "_EMBEDDING_GROUP", "embd", ""},
    {CommGroup::kEp, "ep", "_EXPERT_MODEL_PARALLEL_GROUP", "ep", "exp"},
    {CommGroup::kEtp, "etp", "_EXPERT_TENSOR_PARALLEL_GROUP", "ep_tp", ""},
    {CommGroup::kEdp, "edp", "_EXPERT_DATA_PARALLEL_GROUP", "ep_dp", "dp_modulo_exp"},
};

inline constexpr int kNumCommGroups = static_cast<int>(std::size(kCommGroupTable));

// Row i describes the CommGroup of value i, so a lookup is an index.
constexpr bool CommGroupTableInEnumOrder() {
  for (int i = 0; i < kNumCommGroups; ++i) {
    if (static_cast<int>(kCommGroupTable[i].group) != i) return false;
  }
  return true;
}
static_assert(CommGroupTableInEnumOrder());

// The row of `group`.
constexpr const CommGroupInfo& CommGroupInfoOf(CommGroup group) {
  return kCommGroupTable[static_cast<int>(group)];
}
inline std::string_view CommGroupName(CommGroup group) { return CommGroupInfoOf(group).name; }

// The group memsim names `name`; nullopt for any other name.
std::optional<CommGroup> CommGroupFromName(std::string_view name);

// The group whose communicator a per-group buffer size named `key` sets (training.hccl_group_buffer,
// MindSpeed --hccl-group-buffer): `key` is memsim's name or one of Megatron's pg_names of a group
// made with get_nccl_options. nullopt for any other name, the world's included (its group gets
// no pg_options, so a per-group size never reaches it).
std::optional<CommGroup> CommGroupForBufferKey(std::string_view key);

// memsim's names of the groups CommGroupForBufferKey accepts, in table order: "tp, pp, cp, dp,
// dp_cp, mp, embd, ep, etp and edp" (for messages).
std::string BufferKeyNames();

}  // namespace memsim
