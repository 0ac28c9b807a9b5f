// Issue 4 acceptance: every published case runs or is reported unsupported, and the error
// thresholds hold. The expected numbers are the published measurements in
// tests/validation/cases/*/expected.json; the thresholds are the issue's.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "config/load.h"
#include "engine/stages.h"
#include "validation/validation.h"
#include "workload/build.h"

namespace memsim::validation {
namespace {

const std::vector<CaseResult>& Results() {
  static const std::vector<CaseResult> results =
      RunAllCases(std::string(MEMSIM_SOURCE_DIR) + "/tests/validation/cases");
  return results;
}

// Cases whose framework or feature memsim does not model: exit 2 with "unsupported: <reason>".
TEST_CASE("validation: unmodelled cases are reported unsupported, the rest run", "[validation]") {
  const std::vector<std::string> unsupported = {
      "alcf-polaris-llama7b-tp2-zero2-dp4",                // DeepSpeed ZeRO-2
      "dgxc-llama3.1-8b-bf16-8gpu-mbs4-seq8192-ckptload",  // CUDA graphs + checkpoint resume
      "mcore-doc-dsv3proxy-14L-pp4-ep16-baseline",  // MoE with the flex (DeepEP) dispatcher
      // torchtune's recipes (its own loop, torchao NF4, torch.compile): framework "torchtune"
      "torchtune-llama3.1-8b-rtx4090-lora-r8-qv-bs2-packed2k-compile",
      "torchtune-llama3.1-8b-rtx4090-qlora-r8-attn-mlp-bs2-packed2k-compile",
  };
  REQUIRE(Results().size() == 42);
  for (const CaseResult& c : Results()) {
    INFO(c.id << ": " << c.reason);
    const bool expect_unsupported =
        std::find(unsupported.begin(), unsupported.end(), c.id) != unsupported.end();
    CHECK(c.status == (expect_unsupported ? "unsupported" : "ok"));
    if (expect_unsupported) CHECK(c.reason.rfind("unsupported: ", 0) == 0);
  }
}

TEST_CASE("validation: table lists every case", "[validation]") {
  const std::string report = FormatReport(Results());
  for (const CaseResult& c : Results()) CHECK(report.find(c.id) != std::string::npos);
}

// Issue 4: Korthikanti subtotals within 2% of the paper's closed forms (interleaved cases
// included), and memsim closer to the measurements than the closed form on the median.
TEST_CASE("validation: acceptance thresholds", "[validation]") {
  const Summary s = Summarize(Results());
  // 11 dense cases + the two sseo MoE cases (issue 12) + the three hf-bert cases (issue 13) +
  // the three fms-acceleration Mistral-7B fine-tunes (issue 29) + the four DeepSpeed ZeRO-2
  // runs under the Trainer (issue 33: chenyaofo Llama-7B x 3, ms-swift Qwen2.5-14B) + their five
  // ZeRO-3 runs (chenyaofo x 4, ms-swift). torchtitan's Llama 3.1 8B under FSDP2 (issue 34) reads
  // max_reserved only, which is not a primary metric: it counts in the peak metric.
  CHECK(s.supported_measured == 28);
  CHECK(s.worst_paper_subtotal_error_pct <= 2.0);
  CHECK(s.median_abs_error_pct < s.median_abs_closed_form_error_pct);
  // Issue 4's target (median <= 3 %) was set for the Megatron-core cases and holds there and,
  // since the Trainer's BERT cases run on the PyTorch of their date (1.10: softmax saves its
  // input; docs/validation.md, "Hugging Face Trainer"), over all 16 again.
  CHECK(s.median_abs_error_pct <= 3.0);
  std::vector<CaseResult> megatron;
  for (const CaseResult& c : Results()) {
    const bool trainer = c.id.rfind("hf-", 0) == 0 || c.id.rfind("fms-", 0) == 0 ||
                         c.id.rfind("chenyaofo-", 0) == 0 ||
                         c.id.find("-ds-zero") != std::string::npos;
    if (!trainer) megatron.push_back(c);
  }
  const Summary m = Summarize(megatron);
  CHECK(m.supported_measured == 13);
  CHECK(m.median_abs_error_pct <= 3.0);
}

// Issue 19's peak metric: every peak reading of the ok cases, less those a case's notes mark
// unreliable (zhnotes: "treat max_* as unreliable", its peak counter looks reset), signed and
// sorted; printed next to the primary metric's median.
TEST_CASE("validation: the peak metric counts peak readings and leaves out unreliable ones",
          "[validation]") {
  int peak_rows = 0, unreliable = 0;
  for (const CaseResult& c : Results()) {
    if (c.status != "ok") continue;
    for (const MetricRow& r : c.rows) {
      if (r.metric != Metric::kMaxAllocated && r.metric != Metric::kMaxReserved &&
          r.metric != Metric::kDevice) {
        continue;
      }
      (c.IsUnreliable(r.metric) ? unreliable : peak_rows)++;
    }
    if (c.id == "zhnotes-gpt2small-fp16-1gpu-all-skipped") {
      CHECK(c.IsUnreliable(Metric::kMaxAllocated));
      CHECK(c.IsUnreliable(Metric::kMaxReserved));
      CHECK_FALSE(c.IsUnreliable(Metric::kAllocated));
    }
  }
  CHECK(unreliable == 2);
  const Summary s = Summarize(Results());
  CHECK(static_cast<int>(s.peak_errors_pct.size()) == peak_rows);
  CHECK(std::is_sorted(s.peak_errors_pct.begin(), s.peak_errors_pct.end()));
  CHECK(s.peak_below == std::count_if(s.peak_errors_pct.begin(), s.peak_errors_pct.end(),
                                      [](double e) { return e < 0; }));
  CHECK(FormatReport(Results()).find("Peak metric: ") != std::string::npos);
}

// The two Megatron-FSDP cases publish the same run at DP 1, 2 and 4 (expected.json "variants",
// decimal GB of allocated after iteration 1): memsim follows the whole scaling curve, not one
// point, within 1% (the cases' own DP4 points are in the table).
TEST_CASE("validation: Megatron-FSDP optim and optim_grads follow the published DP scaling",
          "[validation]") {
  struct Point {
    const char* id;
    int dp;
    double measured_gb;
  };
  const Point points[] = {
      {"paip-qwen3-4b-h200-mfsdp-optim-dp4-seq1024", 1, 72.60},
      {"paip-qwen3-4b-h200-mfsdp-optim-dp4-seq1024", 2, 48.46},
      {"paip-qwen3-4b-h200-mfsdp-optim-dp4-seq1024", 4, 36.39},
      {"paip-qwen3-4b-h200-mfsdp-optim-grads-dp4-seq1024", 1, 72.60},
      {"paip-qwen3-4b-h200-mfsdp-optim-grads-dp4-seq1024", 2, 40.33},
      {"paip-qwen3-4b-h200-mfsdp-optim-grads-dp4-seq1024", 4, 24.25},
  };
  for (const Point& pt : points) {
    INFO(pt.id << " at DP " << pt.dp);
    config::LoadOptions load;
    load.overrides = {"training.data_parallel_size=" + std::to_string(pt.dp)};
    const config::Setup setup = config::LoadSetup(
        std::string(MEMSIM_SOURCE_DIR) + "/tests/validation/cases/" + pt.id + "/config.json", load);
    engine::RunOptions options;
    options.keep_timeline = false;
    const engine::RunResult run = engine::RunAllStages(setup, options);
    const double memsim_gb =
        static_cast<double>(run.stages.at(0).spans.at(1).end_allocated_bytes) / 1e9;
    CHECK(run.stages.at(0).spans.at(1).iteration == 1);
    CHECK(std::fabs(memsim_gb - pt.measured_gb) / pt.measured_gb < 0.01);
  }
}

// The closed-form column is Megatron's theoretical_memory_usage.py: the "weight and optimizer"
// figure Megatron printed in each run's own log (quoted in expected.json notes/raw, MB = MiB).
TEST_CASE("validation: closed form equals Megatron's printed weight-and-optimizer estimate",
          "[validation]") {
  struct Row {
    const char* id;
    double megatron_mib;
  };
  const Row rows[] = {
      {"paip-qwen3-4b-1xh200-distopt-seq1024", 69053.29},
      {"sseo-dense-0.21b-dp8-a100", 1524.73},
      {"msswift-qwen2-0.5b-megatron-dp2-seq128", 7211.88},
      {"slurm-on-aws-gpt70b-tp4-pp4-dp2-fullrecompute", 35695.42},
  };
  for (const Row& r : rows) {
    INFO(r.id);
    const config::Setup setup = config::LoadSetup(
        std::string(MEMSIM_SOURCE_DIR) + "/tests/validation/cases/" + r.id + "/config.json", {});
    const workload::ClosedFormEstimate e = workload::ComputeClosedFormEstimate(setup, 0);
    // Printed with two decimals; memsim may differ by the parameter-count rounding (< 0.1 MiB).
    CHECK(std::fabs(static_cast<double>(e.weight_and_optimizer_bytes) / (1 << 20) - r.megatron_mib) <
          0.1);
  }
}

}  // namespace
}  // namespace memsim::validation
