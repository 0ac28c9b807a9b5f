// memsim_validate [CASES_DIR] [--check]: runs every published case (tests/validation/cases by
// default) and prints the validation table (Markdown) of tools/validation/validation.h.
// --check: exit 1 unless the acceptance thresholds of issue 4 hold (median |error| of the
// primary metric <= 3% and below the closed form's; Korthikanti subtotals within 2%).
// Exit 2 on a malformed expected.json.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "validation/validation.h"

int main(int argc, char** argv) {
  std::string dir = MEMSIM_SOURCE_DIR "/tests/validation/cases";
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: memsim_validate [CASES_DIR] [--check]\n");
      return 0;
    } else {
      dir = argv[i];
    }
  }
  try {
    const auto results = memsim::validation::RunAllCases(dir);
    std::fputs(memsim::validation::FormatReport(results).c_str(), stdout);
    if (!check) return 0;
    const memsim::validation::Summary s = memsim::validation::Summarize(results);
    const bool ok = s.median_abs_error_pct <= 3.0 &&
                    s.median_abs_error_pct < s.median_abs_closed_form_error_pct &&
                    s.worst_paper_subtotal_error_pct <= 2.0;
    std::printf("check: %s\n", ok ? "pass" : "FAIL");
    return ok ? 0 : 1;
  } catch (const memsim::InputError& e) {
    std::fprintf(stderr, "memsim_validate: %s\n", e.what());
    return 2;
  }
}
