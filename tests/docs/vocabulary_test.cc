// The documents list each vocabulary as its one declaration in src/ does: profile formats
// (profile/profile.h kFormatTable), memory categories (core/categories.h) and the communicator
// groups that take a per-group buffer size (core/comm_group.h). Adding a row to a table without
// documenting it, or the reverse, fails here.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include "core/categories.h"
#include "core/comm_group.h"
#include "profile/profile.h"

namespace memsim::vocabulary_docs {
namespace {

std::string ReadDoc(const std::string& relative) {
  std::ifstream in(std::string(MEMSIM_SOURCE_DIR) + "/" + relative);
  std::ostringstream s;
  s << in.rdbuf();
  REQUIRE_FALSE(s.str().empty());
  return s.str();
}

// `text` with every run of white space made one space (a list may wrap across lines).
std::string OneSpace(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  return out;
}

// `text` without white space (an option's synopsis may wrap after a '|').
std::string NoSpace(const std::string& text) {
  std::string out = text;
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](unsigned char c) { return std::isspace(c) != 0; }),
            out.end());
  return out;
}

TEST_CASE("docs: the profile formats are those of profile.h's table", "[docs]") {
  const std::string synopsis = "--format" + profile::FormatNames("|") + "]";
  CHECK(NoSpace(ReadDoc("docs/profiles.md")).find(synopsis) != std::string::npos);
  CHECK(NoSpace(ReadDoc("docs/interfaces.md")).find(synopsis) != std::string::npos);
  // docs/profiles.md, 'Formats read': one row per format but auto, in table order.
  const std::string doc = ReadDoc("docs/profiles.md");
  size_t at = doc.find("## Formats read");
  REQUIRE(at != std::string::npos);
  for (const profile::FormatInfo& row : profile::kFormatTable) {
    if (row.format == profile::Format::kAuto) continue;
    CAPTURE(row.name);
    at = doc.find(fmt::format("\n| `{}` |", row.name), at);
    CHECK(at != std::string::npos);
  }
}

TEST_CASE("docs: the categories are those of core/categories.h", "[docs]") {
  // docs/interfaces.md, 'Categories': "`parameters`, `gradients`, ..., `other`."
  std::string list;
  for (int c = 0; c < kNumCategories; ++c) {
    list += fmt::format("{}`{}`", c == 0 ? "" : ", ", CategoryName(static_cast<Category>(c)));
  }
  CHECK(OneSpace(ReadDoc("docs/interfaces.md")).find(list + ".") != std::string::npos);
}

TEST_CASE("docs: hccl_group_buffer names the groups of core/comm_group.h", "[docs]") {
  CHECK(OneSpace(ReadDoc("docs/config.md"))
            .find(fmt::format("memsim makes communicators for {},", BufferKeyNames())) !=
        std::string::npos);
}

}  // namespace
}  // namespace memsim::vocabulary_docs
