// Validation against published measurements (issue 4): runs every case under
// tests/validation/cases/<id>/ (config.json + model.json + expected.json, see
// tests/validation/README.md) through the same path as `memsim run` and compares memsim's
// Megatron report_memory numbers and Megatron's closed-form estimate with what was measured.
// Not part of memsim_lib: it reads expected.json (nlohmann/json) and is used only by
// tools/validate (memsim_validate) and tests/validation/validation_test.cc.
//
// Comparison rules (tests/validation/README.md "How to read a case"): the case's pipeline stage,
// or the worst stage for that metric when the source does not say; after iteration
// `at_iteration`, or iteration 1 when it does not say. "max_*" are peaks since the process
// started (init + iterations 1..N). The primary metric is max_allocated where measured, else
// the device reading, else allocated. Sizes in bytes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/units.h"

namespace memsim::validation {

enum class Metric { kAllocated, kMaxAllocated, kReserved, kMaxReserved, kDevice };
inline constexpr Metric kAllMetrics[] = {Metric::kAllocated, Metric::kMaxAllocated,
                                          Metric::kReserved, Metric::kMaxReserved, Metric::kDevice};
const char* MetricName(Metric m);  // "allocated", "max_allocated", ...

struct MetricRow {
  Metric metric = Metric::kAllocated;
  Bytes measured = 0;
  Bytes memsim = 0;
  Bytes closed_form = 0;  // Megatron's theoretical estimate for the same quantity
  int pipeline_rank = 0;  // the stage compared
  int iteration = 1;      // after this iteration
  double error_pct() const;              // (memsim - measured) / measured · 100
  double closed_form_error_pct() const;  // (closed_form - measured) / measured · 100
};

// The Korthikanti et al. 2022 Figure 1 check: memsim's transformer-layer subtotals under the
// paper's assumptions, next to the paper's closed forms (expected.json reference_values).
struct PaperSubtotals {
  Bytes paper_parameters_and_optimizer = 0;
  Bytes paper_activations = 0;
  // Weight matrices of the first stage's transformer layers (no embeddings, biases, norms):
  // their parameter, fp32 master and Adam-state tensors from the simulated Program plus their
  // share of the DDP grad buffer (numel × grad bytes).
  Bytes memsim_parameters_and_optimizer = 0;
  // The largest sum over the first stage's Program of live saved activations (category
  // activations) whose label starts with "layer": all in-flight micro-batches of all chunks.
  Bytes memsim_activations = 0;
  // What the full simulation of that stage adds: its peak allocated and the category split there.
  Bytes memsim_peak_allocated = 0;
  Bytes memsim_static_bytes = 0;    // all parameters, grads, masters, optimizer states after step 1
  Bytes memsim_activation_peak_bytes = 0;  // category activations at the peak (embedding, logits incl.)
  Bytes memsim_temporaries_at_peak = 0;
  Bytes memsim_reserved_peak = 0;
  bool oom = false;                 // the stage exceeds the device's usable memory
  std::string oom_text;
};

struct CaseResult {
  std::string id;
  std::string status;  // "ok", "unsupported", "error"
  std::string reason;  // the loader's message when not ok
  std::string source;  // the publication, from expected.json
  std::vector<MetricRow> rows;  // measured metrics only
  std::optional<Metric> primary;
  std::optional<PaperSubtotals> paper;
  // Readings the case's expected.json marks unreliable: its optional "unreliable_readings" list of
  // metric names, or a sentence of its notes of the form "treat <metric> as unreliable" (max_*
  // naming both peaks). The peak metric leaves them out; the table still shows them.
  std::vector<Metric> unreliable;
  const MetricRow* PrimaryRow() const;
  bool IsUnreliable(Metric m) const;
};

// Runs one case folder. Never throws for a case memsim cannot load: status says why. Throws
// InputError when expected.json itself is malformed.
CaseResult RunCase(const std::string& case_dir);

// Every case folder under `cases_dir`, sorted by id.
std::vector<CaseResult> RunAllCases(const std::string& cases_dir);

struct Summary {
  int supported_measured = 0;           // ok cases with a primary metric
  double median_abs_error_pct = 0;      // memsim, primary metric
  double median_abs_closed_form_error_pct = 0;
  double worst_paper_subtotal_error_pct = 0;  // over the Korthikanti cases, both subtotals
  // The peak metric (issue 19): every peak reading (max_allocated, max_reserved, device) of the
  // ok cases, less the readings a case marks unreliable. Signed errors, sorted ascending.
  std::vector<double> peak_errors_pct;
  double median_abs_peak_error_pct = 0;
  int peak_below = 0;  // readings where memsim is below the measurement
};
Summary Summarize(const std::vector<CaseResult>& results);

// The table (Markdown): case, metric, stage/iteration, measured, memsim, error %, closed form,
// its error %; then the Korthikanti subtotals, the unsupported list and the summary line. MiB.
std::string FormatReport(const std::vector<CaseResult>& results);

}  // namespace memsim::validation
