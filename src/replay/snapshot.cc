#include "replay/snapshot.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace memsim::replay {
namespace {

using nlohmann::json;

// Pseudo streams for deferred frees start above every renumbered real stream.
constexpr alloc::StreamId kFirstPrivateStream = 1 << 30;

}  // namespace

Trace ParseSnapshot(std::string_view text, std::string_view file_name, int device_index) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    const std::size_t byte = std::min<std::size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(byte), '\n');
    throw InputError(fmt::format("{}:{}: malformed JSON snapshot (byte {})", file_name, line,
                                 e.byte));
  }
  Trace trace;
  trace.file_name = std::string(file_name);
  trace.location_word = "entry ";
  Trace::SnapshotFacts facts;
  auto fail = [&](const std::string& what) {
    return InputError(fmt::format("{}: {}", file_name, what));
  };
  // Legacy form: a bare list of segments, no traces.
  const json* segments = nullptr;
  const json* traces = nullptr;
  if (doc.is_array()) {
    segments = &doc;
  } else if (doc.is_object()) {
    if (doc.contains("segments")) segments = &doc["segments"];
    if (doc.contains("device_traces")) traces = &doc["device_traces"];
    if (!segments && !traces) {
      throw fail("not a PyTorch memory snapshot (no 'segments' or 'device_traces')");
    }
  } else {
    throw fail("not a PyTorch memory snapshot (expected a JSON object)");
  }
  if (segments) {
    if (!segments->is_array()) throw fail("/segments must be a list");
    for (std::size_t i = 0; i < segments->size(); ++i) {
      const json& seg = (*segments)[i];
      if (!seg.is_object() || !seg.contains("total_size") ||
          !seg["total_size"].is_number_integer()) {
        throw fail(fmt::format("/segments/{}: expected an object with an integer total_size", i));
      }
      const int device = seg.contains("device") && seg["device"].is_number_integer()
                             ? seg["device"].get<int>()
                             : 0;
      if (device == device_index) facts.reserved_end_bytes += seg["total_size"].get<Bytes>();
    }
  }
  if (traces) {
    if (!traces->is_array()) throw fail("/device_traces must be a list of lists");
    if (device_index < 0 || static_cast<std::size_t>(device_index) >= traces->size()) {
      if (!traces->empty() || device_index != 0) {
        throw fail(fmt::format("device index {} not in the snapshot ({} device traces)",
                               device_index, traces->size()));
      }
    } else {
      const json& entries = (*traces)[static_cast<std::size_t>(device_index)];
      if (!entries.is_array()) {
        throw fail(fmt::format("/device_traces/{} must be a list", device_index));
      }
      std::map<std::uint64_t, alloc::StreamId> streams;  // raw handle -> 0, 1, ...
      struct Live {
        std::int32_t id;
        alloc::StreamId private_stream = -1;  // >= 0 while a deferred free is pending
      };
      std::unordered_map<std::uint64_t, Live> live;  // by address; lookups only
      alloc::StreamId next_private = kFirstPrivateStream;
      facts.entries = static_cast<std::int64_t>(entries.size());
      auto entry_fail = [&](std::size_t i, const std::string& what) {
        return InputError(fmt::format("{}:entry {}: {}", file_name, i, what));
      };
      auto get_u64 = [&](const json& e, std::size_t i, const char* key) -> std::uint64_t {
        if (!e.contains(key)) throw entry_fail(i, fmt::format("missing '{}'", key));
        const json& v = e[key];
        if (v.is_number_unsigned()) return v.get<std::uint64_t>();
        if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
          return static_cast<std::uint64_t>(v.get<std::int64_t>());
        }
        throw entry_fail(i, fmt::format("'{}' must be a non-negative integer", key));
      };
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const json& e = entries[i];
        if (!e.is_object() || !e.contains("action") || !e["action"].is_string()) {
          throw entry_fail(i, "expected an object with a string 'action'");
        }
        const std::string action = e["action"].get<std::string>();
        const auto line = static_cast<std::int32_t>(i);
        if (action == "segment_alloc" || action == "segment_map") {
          ++facts.segment_allocs;
        } else if (action == "segment_free" || action == "segment_unmap") {
          ++facts.segment_frees;
        } else if (action == "snapshot" || action == "oom" || action == "workspace_snapshot") {
          // markers
        } else if (action == "alloc") {
          const std::uint64_t addr = get_u64(e, i, "addr");
          const std::uint64_t size = get_u64(e, i, "size");
          const std::uint64_t raw_stream = e.contains("stream") ? get_u64(e, i, "stream") : 0;
          auto [sit, fresh] =
              streams.try_emplace(raw_stream, static_cast<alloc::StreamId>(streams.size()));
          (void)fresh;
          if (live.count(addr)) {
            throw entry_fail(i, fmt::format("alloc at address {} that is still allocated", addr));
          }
          if (size > static_cast<std::uint64_t>(INT64_MAX)) {
            throw entry_fail(i, "'size' is too large");
          }
          const auto id = static_cast<std::int32_t>(trace.ids.size());
          trace.ids.push_back(fmt::format("0x{:x}", addr));
          live[addr] = {id};
          trace.records.push_back(
              {TraceOp::kMalloc, id, static_cast<Bytes>(size), sit->second, line});
        } else if (action == "free_requested") {
          const std::uint64_t addr = get_u64(e, i, "addr");
          auto it = live.find(addr);
          if (it == live.end() || it->second.private_stream >= 0) {
            ++facts.skipped;
            continue;
          }
          // free_block right away emits free_completed as the very next entry.
          bool immediate = false;
          if (i + 1 < entries.size()) {
            const json& n = entries[i + 1];
            immediate = n.is_object() && n.value("action", "") == "free_completed" &&
                        n.contains("addr") && n["addr"].is_number() &&
                        n["addr"].get<std::uint64_t>() == addr;
          }
          if (immediate) {
            trace.records.push_back({TraceOp::kFree, it->second.id, 0, 0, line});
            live.erase(it);
            ++i;  // the free_completed is part of this free
          } else {
            it->second.private_stream = next_private++;
            trace.records.push_back(
                {TraceOp::kRecordStream, it->second.id, 0, it->second.private_stream, line});
            trace.records.push_back({TraceOp::kFree, it->second.id, 0, 0, line});
          }
        } else if (action == "free_completed") {
          const std::uint64_t addr = get_u64(e, i, "addr");
          auto it = live.find(addr);
          if (it == live.end() || it->second.private_stream < 0) {
            ++facts.skipped;
            continue;
          }
          trace.records.push_back({TraceOp::kComplete, -1, 0, it->second.private_stream, line});
          live.erase(it);
        } else {
          throw entry_fail(i, fmt::format("unknown action '{}'", action));
        }
      }
    }
  }
  trace.snapshot = facts;
  return trace;
}

}  // namespace memsim::replay
