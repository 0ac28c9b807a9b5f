// The allocator statistics, declared once (style.md rule 9): one row per AllocatorStats member
// with its torch.cuda.memory_stats() name, unit and meaning (c10 DeviceStats;
// docs/allocator-rules.md, 'Statistics'). The replay JSON and text output, and the docs, are
// generated from this table.
#pragma once

#include <cstdint>
#include <string_view>

#include "alloc/allocator.h"

namespace memsim::alloc {

enum class StatKind { kGauge, kCounter };

struct StatInfo {
  std::string_view name;  // torch.cuda.memory_stats() key without ".all.current/.peak"
  StatKind kind;
  Gauge AllocatorStats::*gauge;            // kGauge
  std::int64_t AllocatorStats::*counter;   // kCounter
  std::string_view unit;                   // "bytes" or "count"
  std::string_view description;
  bool in_replay_json;                     // a replay --json field (docs/interfaces.md)
};

inline constexpr StatInfo kStatTable[] = {
    {"allocated_bytes", StatKind::kGauge, &AllocatorStats::allocated_bytes, nullptr, "bytes",
     "bytes of allocated blocks (block sizes after rounding and the split decision)", true},
    {"reserved_bytes", StatKind::kGauge, &AllocatorStats::reserved_bytes, nullptr, "bytes",
     "bytes of device memory held: segments plus mapped expandable pages", true},
    {"active_bytes", StatKind::kGauge, &AllocatorStats::active_bytes, nullptr, "bytes",
     "allocated bytes plus blocks freed but waiting for stream events", true},
    {"requested_bytes", StatKind::kGauge, &AllocatorStats::requested_bytes, nullptr, "bytes",
     "bytes the callers asked for (before rounding and padding) of active blocks", true},
    {"inactive_split_bytes", StatKind::kGauge, &AllocatorStats::inactive_split_bytes, nullptr,
     "bytes", "free bytes inside partly used (split) non-expandable segments", true},
    {"allocation", StatKind::kGauge, &AllocatorStats::allocation, nullptr, "count",
     "allocated blocks", false},
    {"active", StatKind::kGauge, &AllocatorStats::active, nullptr, "count", "active blocks",
     false},
    {"segment", StatKind::kGauge, &AllocatorStats::segment, nullptr, "count",
     "device allocations (cudaMalloc); expandable segments never count", true},
    {"inactive_split", StatKind::kGauge, &AllocatorStats::inactive_split, nullptr, "count",
     "free blocks inside split non-expandable segments", false},
    {"oversize_allocations", StatKind::kGauge, &AllocatorStats::oversize_allocations, nullptr,
     "count", "allocated blocks of at least max_split_size", false},
    {"oversize_segments", StatKind::kGauge, &AllocatorStats::oversize_segments, nullptr, "count",
     "segments of at least max_split_size", false},
    {"num_alloc_retries", StatKind::kCounter, nullptr, &AllocatorStats::num_alloc_retries,
     "count", "device allocations retried after releasing every cached block", true},
    {"num_ooms", StatKind::kCounter, nullptr, &AllocatorStats::num_ooms, "count",
     "mallocs that failed after the whole out-of-memory path", true},
    {"num_device_alloc", StatKind::kCounter, nullptr, &AllocatorStats::num_device_alloc, "count",
     "device allocations: cudaMalloc calls and expandable page mappings", false},
    {"num_device_free", StatKind::kCounter, nullptr, &AllocatorStats::num_device_free, "count",
     "device frees: cudaFree calls and expandable page unmappings", false},
};

}  // namespace memsim::alloc
