#include "report/check.h"

#include <catch2/catch.hpp>
#include <tinyxml2.h>

#include "core/error.h"

namespace memsim::report {
namespace {

using namespace memsim::literals;

// A device with 10 GiB usable and a 1 GiB idle baseline: check's peak is device − baseline.
config::Setup Device10G() {
  config::Setup setup;
  setup.device.name = "test";
  setup.device.usable_memory_bytes = 10_GiB;
  setup.device.idle_baseline_bytes = 1_GiB;
  return setup;
}

engine::RunResult OneStage(Bytes peak_device, Bytes peak_allocated = 4_GiB) {
  engine::RunResult run;
  engine::StageResult s;
  s.pipeline_rank = 0;
  s.peak_device_bytes = peak_device;
  s.peak_reserved_bytes = peak_allocated;
  s.peak_allocated_bytes = peak_allocated;
  s.by_category_at_peak[static_cast<int>(Category::kActivations)] = peak_allocated;
  run.stages.push_back(s);
  return run;
}

TEST_CASE("check: a config that fits is ok and reports its headroom", "[check]") {
  // Device peak 7 GiB − baseline 1 GiB = 6 GiB; 10 GiB usable: headroom 4 GiB, above the 5%
  // margin (0.5 GiB).
  const auto v = CheckStages("a.json", OneStage(7_GiB), Device10G(), {}, nullptr);
  REQUIRE(v.size() == 1);
  CHECK(v[0].verdict == "ok");
  CHECK(v[0].peak_bytes == 6_GiB);
  CHECK(v[0].headroom_bytes == 4_GiB);
}

TEST_CASE("check: over capacity names the stage and the shortfall", "[check]") {
  // 12 GiB − 1 GiB = 11 GiB peak on 10 GiB usable: short by 1 GiB.
  const auto v = CheckStages("a.json", OneStage(12_GiB), Device10G(), {}, nullptr);
  CHECK(v[0].verdict == "over");
  CHECK(v[0].headroom_bytes == -1_GiB);
  CHECK(v[0].message == "peak 11.00 GiB exceeds usable 10.00 GiB by 1.00 GiB");
  CHECK(FormatCheckText(v, {}) ==
        "FAIL over  a.json stage 0: peak 11.00 GiB exceeds usable 10.00 GiB by 1.00 GiB\n");
}

TEST_CASE("check: within the margin fails", "[check]") {
  // 10.8 GiB − 1 GiB = 9.8 GiB peak: fits 10 GiB but is above 95% of it (9.5 GiB).
  const Bytes peak = 10_GiB + 800_MiB;
  CHECK(CheckStages("a.json", OneStage(peak), Device10G(), {}, nullptr)[0].verdict == "margin");
  // With a 1% margin the line is 9.9 GiB: ok.
  CheckOptions loose;
  loose.margin_pct = 1;
  CHECK(CheckStages("a.json", OneStage(peak), Device10G(), loose, nullptr)[0].verdict == "ok");
}

TEST_CASE("check: baseline growth above the tolerance is a regression, below is not",
          "[check]") {
  BaselineStage base;
  base.pipeline = 0;
  base.peak_allocated_bytes = 4_GiB;
  base.peak_reserved_bytes = 4_GiB;
  base.peak_device_bytes = 7_GiB;
  base.by_category_at_peak[static_cast<int>(Category::kActivations)] = 4_GiB;
  const std::vector<BaselineStage> baseline = {base};
  // +2% allocated (4 GiB × 1.02) with tolerance 1%: regression, activations grew.
  const Bytes grown = 4_GiB + 4_GiB / 50;
  auto v = CheckStages("a.json", OneStage(7_GiB, grown), Device10G(), {}, &baseline);
  CHECK(v[0].verdict == "regression");
  REQUIRE(v[0].grew.size() == 1);
  CHECK(v[0].grew[0] == std::pair<std::string, Bytes>("activations", 4_GiB / 50));
  // The same growth with tolerance 5%: ok.
  CheckOptions tolerant;
  tolerant.tolerance_pct = 5;
  v = CheckStages("a.json", OneStage(7_GiB, grown), Device10G(), tolerant, &baseline);
  CHECK(v[0].verdict == "ok");
}

TEST_CASE("check: a malformed baseline is an input error naming file and field", "[check]") {
  CHECK_THROWS_WITH(ParseBaseline("b.json", "{"),
                    "b.json: byte 2: not valid JSON (expected a `memsim run --json` report)");
  CHECK_THROWS_WITH(ParseBaseline("b.json", R"({"schema_version": 1, "stages": [{"pipeline": 0}]})"),
                    "b.json: /stages/0/peak_allocated_bytes: expected a byte count (an integer from 0 to 2^62), missing");
  CHECK_THROWS_WITH(ParseBaseline("b.json", R"({"schema_version": 2})"),
                    "b.json: /schema_version: expected 1 (a `memsim run --json` report)");
  const auto stages = ParseBaseline(
      "b.json",
      R"({"schema_version": 1, "stages": [{"pipeline": 1, "peak_allocated_bytes": 1,
          "peak_reserved_bytes": 2, "peak_device_bytes": 3, "by_category_at_peak": {"activations": 1}}]})");
  REQUIRE(stages.size() == 1);
  CHECK(stages[0].pipeline == 1);
  CHECK(stages[0].peak_device_bytes == 3);
}

TEST_CASE("check: the JUnit file is well-formed XML as CI systems read it", "[check]") {
  auto v = CheckStages("ok.json", OneStage(7_GiB), Device10G(), {}, nullptr);
  auto over = CheckStages("big <&> \"x\".json", OneStage(12_GiB), Device10G(), {}, nullptr);
  v.insert(v.end(), over.begin(), over.end());
  const std::string xml = CheckJUnit(v, {{"bad.json", "bad.json: /training: expected an object"}});
  tinyxml2::XMLDocument doc;
  REQUIRE(doc.Parse(xml.c_str()) == tinyxml2::XML_SUCCESS);
  const tinyxml2::XMLElement* suites = doc.FirstChildElement("testsuites");
  REQUIRE(suites != nullptr);
  CHECK(suites->IntAttribute("tests") == 3);
  CHECK(suites->IntAttribute("failures") == 1);
  CHECK(suites->IntAttribute("errors") == 1);
  const tinyxml2::XMLElement* first = suites->FirstChildElement("testsuite");
  REQUIRE(first != nullptr);
  CHECK(std::string(first->Attribute("name")) == "ok.json");
  const tinyxml2::XMLElement* second = first->NextSiblingElement("testsuite");
  REQUIRE(second != nullptr);
  CHECK(std::string(second->Attribute("name")) == "big <&> \"x\".json");
  const tinyxml2::XMLElement* failure =
      second->FirstChildElement("testcase")->FirstChildElement("failure");
  REQUIRE(failure != nullptr);
  CHECK(std::string(failure->Attribute("type")) == "over");
  const tinyxml2::XMLElement* third = second->NextSiblingElement("testsuite");
  REQUIRE(third != nullptr);
  CHECK(third->FirstChildElement("testcase")->FirstChildElement("error") != nullptr);
}

}  // namespace
}  // namespace memsim::report
