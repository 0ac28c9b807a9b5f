// PyTorch memory snapshots (torch.cuda.memory._snapshot() saved as JSON; reference/formats.md
// §2) as allocator traces (design.md "Allocator traces"): the `device_traces` of one device
// become malloc / free / record_stream / complete operations:
//   alloc            -> malloc of the entry's size (the requested size, orig_size) on its stream
//   free_requested   -> free; when its free_completed does not follow at once, the block was in
//                       use on another stream: record_stream on a private stream, then free
//   free_completed   -> (deferred blocks) complete of that private stream, so the block returns
//                       to its pool at the next malloc, as process_events does
//   segment_alloc / segment_map / segment_free / segment_unmap -> counted for the fidelity line
//   snapshot, oom, workspace_snapshot (torch_npu) -> ignored
// Entries about blocks the ring buffer never saw allocated are skipped and counted. Raw stream
// handles are renumbered 0, 1, ... in order of first appearance. Not modelled: empty_cache
// calls, which a snapshot does not record (their segment_free entries show in the fidelity).
#pragma once

#include <string_view>

#include "replay/trace.h"

namespace memsim::replay {

// Throws InputError "<file>: ..." for malformed JSON, a missing device, or an entry of the
// wrong shape ("<file>:entry <i>: ...", i counted from 0 in device_traces[device_index]).
Trace ParseSnapshot(std::string_view text, std::string_view file_name, int device_index);

}  // namespace memsim::replay
