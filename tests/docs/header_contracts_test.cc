// Header contracts: a header under src/ that lists what memsim does not model must not list
// something the code models (docs/architecture.md, 'Modules'; every header opens with what it
// models and what it does not).
//
// How the check reads a header (deterministic, no guessing):
// - its full-line comments (`//` as the first non-blank characters) are joined into blocks, one
//   block per run of consecutive comment lines, each line break read as one blank;
// - a block is cut into sentences at a period followed by a blank, at an empty comment line and
//   at the block's end; a period inside parentheses ends none ("(e.g. x)" stays whole);
// - a sentence containing "not modelled" or "does not model" (any case) is a not-modelled
//   sentence.
// kModelled lists features memsim models: the phrases (case-insensitive ECMAScript regular
// expressions) that would name the feature in a stale not-modelled sentence, and the evidence
// that it is modelled, a string that must occur in a file of the repository. A not-modelled
// sentence matching a row's phrase fails, naming the header and line; a row whose evidence is
// gone fails too (the feature moved: update the evidence; or it is no longer modelled: drop the
// row). When a header must say a modelled feature's name near its not-modelled list, put it in
// a sentence of its own (see modules/attention.h).
//
// The check fails on the stale headers it was written for: the test case "... flags the stale
// attention.h" feeds it the comment of src/workload/modules/attention.h as it was before the
// fix (git show 3753f88:src/workload/modules/attention.h), and it reports two findings
// (attention masks, context-parallel communication).
#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace memsim::header_contracts {
namespace {

namespace fs = std::filesystem;

struct ModelledFeature {
  const char* feature;
  const char* stale_phrase;  // case-insensitive regular expression
  const char* evidence_file;  // relative to the repository root
  const char* evidence;       // must occur in evidence_file
};

const ModelledFeature kModelled[] = {
    {"mixture of experts", R"(\bMoE\b|mixture[- ]of[- ]experts|expert parallelism)",
     "src/workload/modules/moe.h", "class MoeModule final : public LayerModule"},
    {"context-parallel communication",
     R"(\bCP communication|context[- ]parallel(ism)? communication)",
     "src/workload/modules/attention.cc", "Collective(CommGroup::kCp"},
    {"attention masks", R"(attention[- ]masks?\b)", "src/workload/modules/embedding.cc",
     "\"data.attention_mask\""},
    {"encoder models (BERT)", R"(\bencoder models?\b|\bBERT\b)",
     "src/workload/modules/hf_encoder.h", "class ClassificationHead"},
    {"PyTorch DistributedDataParallel",
     R"(DistributedDataParallel|\b(torch|PyTorch) DDP\b|one device only)",
     "src/workload/torch_ddp.cc", "NewTorchDdp"},
    {"LoRA / QLoRA adapters", R"(\bQ?LoRA\b|\bPEFT\b)", "src/workload/hf_peft.h",
     "struct PeftKernels"},
    {"Megatron's distributed optimizer", R"(distributed optimi[sz]er|\bZeRO-1\b)",
     "src/workload/ddp.cc", "distributed_optimizer"},
    {"the Trainer's evaluation pass", R"(evaluation (pass|loop)|\beval_steps\b)",
     "src/workload/evaluation.h", "void RunEvaluation("},
};

struct Finding {
  int line = 0;
  std::string feature;
  std::string sentence;
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A sentence with the line it starts on.
struct Sentence {
  int line = 0;
  std::string text;
};

// The sentences of the full-line comments of `source` (above).
std::vector<Sentence> CommentSentences(const std::string& source) {
  std::vector<Sentence> out;
  std::istringstream in(source);
  std::string line, text;
  int line_no = 0, depth = 0, start = 0;
  const auto end_sentence = [&] {
    if (text.find_first_not_of(' ') != std::string::npos) out.push_back({start, text});
    text.clear();
    start = 0;
  };
  while (std::getline(in, line)) {
    ++line_no;
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line.compare(first, 2, "//") != 0) {
      end_sentence();  // a block ends
      depth = 0;
      continue;
    }
    // The text after "//" without its leading blanks: a line break reads as one blank.
    const std::size_t text_at = line.find_first_not_of(" \t", first + 2);
    const std::string body = text_at == std::string::npos ? "" : line.substr(text_at);
    if (body.empty()) {  // an empty comment line ends a paragraph
      end_sentence();
      depth = 0;
      continue;
    }
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (start == 0 && body[i] != ' ') start = line_no;
      text += body[i];
      if (body[i] == '(') ++depth;
      if (body[i] == ')' && depth > 0) --depth;
      if (body[i] == '.' && depth == 0 && (i + 1 == body.size() || body[i + 1] == ' ')) {
        end_sentence();
      }
    }
    text += ' ';
  }
  end_sentence();
  return out;
}

// The not-modelled sentences of `source` that name a modelled feature.
std::vector<Finding> StaleClaims(const std::string& source) {
  std::vector<Finding> findings;
  for (const Sentence& s : CommentSentences(source)) {
    const std::string lower = Lower(s.text);
    if (lower.find("not modelled") == std::string::npos &&
        lower.find("does not model") == std::string::npos) {
      continue;
    }
    for (const ModelledFeature& f : kModelled) {
      if (std::regex_search(s.text, std::regex(f.stale_phrase, std::regex::icase))) {
        findings.push_back({s.line, f.feature, s.text});
      }
    }
  }
  return findings;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("every feature the contracts check treats as modelled still has its evidence",
          "[docs][contracts]") {
  for (const ModelledFeature& f : kModelled) {
    INFO(f.feature << ": " << f.evidence_file << " should contain " << f.evidence);
    const fs::path path = fs::path(MEMSIM_SOURCE_DIR) / f.evidence_file;
    REQUIRE(fs::is_regular_file(path));
    CHECK(ReadAll(path).find(f.evidence) != std::string::npos);
  }
}

TEST_CASE("no header's not-modelled list names a feature the code models", "[docs][contracts]") {
  const fs::path src = fs::path(MEMSIM_SOURCE_DIR) / "src";
  int headers = 0;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file() || e.path().extension() != ".h") continue;
    ++headers;
    const std::string relative = fs::relative(e.path(), MEMSIM_SOURCE_DIR).generic_string();
    const std::vector<Finding> findings = StaleClaims(ReadAll(e.path()));
    for (const Finding& f : findings) {
      FAIL_CHECK(relative << ":" << f.line << ": a not-modelled sentence names " << f.feature
                          << ", which memsim models: \"" << f.sentence << "\"");
    }
  }
  CHECK(headers > 50);  // the walk found the headers
}

TEST_CASE("the header contracts check flags the stale attention.h and passes its fix",
          "[docs][contracts]") {
  // src/workload/modules/attention.h's last comment lines before the fix.
  const std::string stale =
      "// Selective recompute of \"core_attn\" re-runs core attention in backward instead of "
      "saving it.\n"
      "// Not modelled: attention masks (--no-create-attention-mask-in-dataloader assumed), "
      "RoPE\n"
      "// output copies, context-parallel communication.\n"
      "#pragma once\n";
  const std::vector<Finding> found = StaleClaims(stale);
  REQUIRE(found.size() == 2);
  CHECK(found[0].feature == "context-parallel communication");
  CHECK(found[1].feature == "attention masks");
  CHECK(found[0].line == 2);
  // The fix says what is modelled in a sentence of its own.
  const std::string fixed =
      "// The dataloader's causal mask, where there is one, is a batch tensor (embedding.h).\n"
      "// Not modelled: RoPE output copies, the context-parallel ring's receive buffers.\n";
  CHECK(StaleClaims(fixed).empty());
}

TEST_CASE("the header contracts check reads a parenthesis as part of its sentence",
          "[docs][contracts]") {
  // The period after "e.g" and the one inside the parenthesis end no sentence, so the
  // not-modelled clause in the parenthesis belongs to the sentence naming attention masks, which
  // starts on line 1.
  const std::string text =
      "// A batch tensor (e.g. attention\n"
      "// masks. Not modelled: their copies). Not modelled: RoPE output copies.\n";
  const std::vector<Finding> found = StaleClaims(text);
  REQUIRE(found.size() == 1);
  CHECK(found[0].feature == "attention masks");
  CHECK(found[0].line == 1);
}

}  // namespace
}  // namespace memsim::header_contracts
