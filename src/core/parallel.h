// Parallel work whose results are used in a fixed order (engine/stages.cc: one simulation per
// pipeline stage, merged by rank), so that what a caller computes does not depend on how many
// threads did the work or on which finished first.
#pragma once

#include <functional>

namespace memsim {

// CPUs this process may run on (its affinity mask: taskset, a container's cpuset), at least 1.
int AvailableCpus();

// Calls work(i) for every i in [0, n) on up to `threads` threads of its own, and merge(i) on the
// calling thread in order of i, each after work(i) has returned. Items start in order of i, and
// at most `threads` are started and not yet merged, so at most that many results wait in memory.
// work(i) and work(j) may run at once (they must not share mutable state); merge calls never
// overlap each other. An exception thrown by work(i) or merge(i) is rethrown once every started
// item has finished, when the items before i have been merged; no item after i is merged and
// no new one starts. threads <= 1 (or n <= 1): work(i) then merge(i) in turn on the calling
// thread, no thread started.
void RunInOrder(int n, int threads, const std::function<void(int)>& work,
                const std::function<void(int)>& merge);

}  // namespace memsim
