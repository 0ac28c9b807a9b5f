// PyTorch memory snapshots (torch.cuda.memory._snapshot() saved as JSON, or pickled by
// _dump_snapshot / torch_npu's twin, read by core/pickle.h;
// docs/profile-formats.md, 'PyTorch memory snapshot') as allocator traces (docs/interfaces.md,
// 'Snapshot replay'): the `device_traces` of one device
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

#include <nlohmann/json_fwd.hpp>

#include "replay/trace.h"

namespace memsim::replay {

// Throws InputError for malformed JSON ("<file>:<line>: malformed JSON snapshot (byte <n>)"),
// a missing device, or any value of the wrong type or range, named by its JSON pointer
// ("<file>: /device_traces/0/3/action: expected a string, got 5"). Numbers are checked: sizes
// and total_size are integers in [0, 2^62) and their per-device sum stays below 2^62, addresses
// and stream handles integers in [0, 2^64), devices integers in [0, 2^31). No nlohmann
// exception escapes; a key repeated in one object is an error ("<file>: /segments: duplicate
// key"); nesting deeper than 64 levels is an error ("<file>:<line>: JSON nested deeper than
// memsim's limit of 64 levels (byte <n>; ...)"), found as the parser reaches it.
// A pickle (LooksLikePickle) is read by PickleToJson first, whose errors name the byte.
Trace ParseSnapshot(std::string_view text, std::string_view file_name, int device_index);

// For a reader of a snapshot still arriving (a pipe, an endless stream): true iff ParseSnapshot
// of `prefix`, the bytes so far, would fail only for want of more bytes (or succeed, since
// more bytes may follow). False when the prefix already holds the error ParseSnapshot of the
// whole would report (JSON: a syntax error before its last byte read, nesting deeper than
// memsim's limit of 64 levels; a pickle: PickleNeedsMoreBytes, core/pickle.h), or a whole
// pickle, so that the reader can stop there and hand ParseSnapshot the prefix. Linear in the
// prefix; nothing kept.
bool SnapshotNeedsMoreBytes(std::string_view prefix);

// The same from a document already parsed (JSON or unpickled).
Trace TraceFromSnapshot(const nlohmann::json& doc, std::string_view file_name, int device_index);

}  // namespace memsim::replay
