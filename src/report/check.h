// Memory gates for CI (`memsim check`, docs/interfaces.md, 'Command line'; issue 6). Pure
// functions: a run's per-stage peaks against the usable memory (with a margin) and against a
// baseline report (a previous `run --json`, with a tolerance), then the verdicts as text, JSON and
// JUnit XML.
//
// Peak = the peak over the run of reserved + memory outside the allocator (context and
// communicator buffers; the idle baseline is not counted because usable memory already
// excludes it). Headroom = usable − peak. Verdicts, first match wins:
//   "oom"        the simulation took the allocator's out-of-memory path;
//   "over"       peak > usable;
//   "margin"     peak > usable × (1 − margin/100);
//   "regression" peak allocated, reserved or device of the stage grew by more than
//                tolerance % over the baseline's same stage;
//   "ok"         otherwise.
// With `check --require-plans N` each config also gets one verdict that is no stage's
// (StageVerdict::plans): "ok" when at least N layouts of `memsim plan`'s default space fit with
// the margin (docs/plan.md), "no-plan" otherwise (PlanGateVerdict).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/setup.h"
#include "engine/stages.h"

namespace memsim::report {

struct CheckOptions {
  std::optional<Bytes> usable_memory_bytes;  // --capacity; else the device preset's
  double margin_pct = 5.0;
  double tolerance_pct = 1.0;
};

// One stage of a previous run report, as read from its JSON.
struct BaselineStage {
  int pipeline = 0;
  Bytes peak_allocated_bytes = 0;
  Bytes peak_reserved_bytes = 0;
  Bytes peak_device_bytes = 0;
  CategoryBytes by_category_at_peak{};
};

// Reads the "stages" of a `run --json` report. Throws InputError naming `path` and the JSON
// pointer of the first field that is missing or of the wrong type.
std::vector<BaselineStage> ParseBaseline(const std::string& path, const std::string& text);

struct StageVerdict {
  std::string config;  // the path as given
  int pipeline = 0;
  Bytes peak_bytes = 0;
  Bytes usable_bytes = 0;
  Bytes headroom_bytes = 0;
  std::string verdict;  // "ok", "over", "margin", "oom", "regression"; "no-plan" (plans)
  std::string message;  // one line: why, with numbers
  // The --require-plans verdict of the config, not a stage's (pipeline is then -1 and the byte
  // counts are the best fitting plan's, 0 when none fits).
  bool plans = false;
  // Categories that grew at the stage's allocated peak vs the baseline (bytes > 0 only).
  std::vector<std::pair<std::string, Bytes>> grew;
  bool operator==(const StageVerdict&) const = default;
};

// The verdict of every stage of `run`. `baseline` may be null (no regression check).
std::vector<StageVerdict> CheckStages(const std::string& config, const engine::RunResult& run,
                                      const config::Setup& setup, const CheckOptions& options,
                                      const std::vector<BaselineStage>* baseline);

// The --require-plans verdict of `config`: "ok" when `fitting` >= `required` (>= 1) of the
// `simulated` layouts fit, else "no-plan". `best` names the best fitting plan (its layout,
// "" when none fits) and `best_peak_bytes` / `usable_bytes` its peak and usable memory;
// `reason` says why the closest layout does not fit ("" when one fits).
StageVerdict PlanGateVerdict(const std::string& config, int fitting, int simulated, int required,
                             const std::string& best, Bytes best_peak_bytes, Bytes usable_bytes,
                             const std::string& reason);

// A config that could not be checked (bad input): its message, reported as an error.
struct CheckError {
  std::string config;
  std::string message;
};

std::string FormatCheckText(const std::vector<StageVerdict>& verdicts,
                            const std::vector<CheckError>& errors);
std::string CheckJson(const std::vector<StageVerdict>& verdicts,
                      const std::vector<CheckError>& errors);
// JUnit XML as CI systems read it: <testsuites> with one <testsuite> per config and one
// <testcase> per stage; a failing stage has a <failure>, a bad config one <error> testcase.
std::string CheckJUnit(const std::vector<StageVerdict>& verdicts,
                       const std::vector<CheckError>& errors);

}  // namespace memsim::report
