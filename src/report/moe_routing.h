// The MoE routing lines of `memsim run`: which token distribution the table shows (balanced, or
// the most loaded rank at moe_imbalance_factor F) and the peaks of the reported stage under
// both, so that the effect of routing imbalance on the dispatcher's receive buffers and the
// expert tensors (workload/modules/moe.h) is visible next to the table.
#pragma once

#include <optional>
#include <string>

#include "config/setup.h"
#include "engine/stages.h"

namespace memsim::report {

// The imbalance factor compared with the config's: the config's own when above 1, else 1.5
// (memsim's choice of an example factor, not from any measurement).
double ComparedImbalance(const config::Setup& setup);

// "MoE routing: ..." lines (two): `run` ran at setup.training.moe_imbalance_factor; the
// reported stage runs once more under the other distribution (balanced when the config's
// factor is above 1, else ComparedImbalance), over the iterations `run` simulated
// (engine::SimulatedSetup), so a long run costs no more than its simulated iterations. "" for a dense model. `usable_memory_bytes`:
// --capacity, as for `run`.
std::string FormatMoeRouting(const config::Setup& setup, const engine::RunResult& run,
                             std::optional<Bytes> usable_memory_bytes);

}  // namespace memsim::report
