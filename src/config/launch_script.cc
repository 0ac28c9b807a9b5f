// The launch-script and training-log readers (launch_script.h). The script reader is a subset of
// bash's grammar and evaluation (bash(1): "SHELL GRAMMAR", "QUOTING", "PARAMETERS", "EXPANSION",
// "ARITHMETIC EVALUATION", "CONDITIONAL EXPRESSIONS", "FUNCTIONS", "Arrays"), read in one pass:
// each command is read, expanded only when it runs (a skipped branch expands nothing) and run;
// a function body and an `eval`'s text are read the same way when run. Expansion reads the
// variables in place, so that reading time is linear in the script's size.
#include "config/launch_script.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "config/reader.h"
#include "core/error.h"
#include "core/read_file.h"

namespace memsim::config {
namespace {

using internal::Printable;

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }
bool EndsWord(char c) {
  return IsBlank(c) || c == '\n' || c == ';' || c == '&' || c == '|' || c == '<' || c == '>' ||
         c == '(' || c == ')';
}

std::optional<std::int64_t> ParseInt(std::string_view s) {
  std::int64_t v = 0;
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The value of a launcher's world-size option: a count in 1..2^20, or torchrun's elastic range
// "MIN:MAX", whose minimum is taken (*elastic set); nullopt when it is neither.
std::optional<int> WorldCount(std::string_view value, bool* elastic) {
  if (const size_t colon = value.find(':'); colon != std::string_view::npos) {
    *elastic = true;
    value = value.substr(0, colon);
  }
  const std::optional<std::int64_t> n = ParseInt(value);
  if (!n || *n < 1 || *n > 1 << 20) return std::nullopt;
  return static_cast<int>(*n);
}

std::string WorldCountError(const std::string& name, const std::string& value, bool msrun) {
  return fmt::format("{}: expected a positive number of {}, got '{}'", name,
                     msrun || name == "--nproc_per_node" ? "processes" : "nodes",
                     Printable(value, 40));
}

// The source line of each character of a field: where it was written, through variables (so
// that an argument of `ARGS=( ... )` or `ARGS="..."` expanded on the launch line keeps the line
// of the group it is written in).
using CharLines = std::vector<int>;

// One word of a command after expansion: its fields (word splitting and "${A[@]}" can make
// several, an empty unquoted expansion none) and the line it started on.
struct Word {
  std::vector<std::string> fields;
  std::vector<CharLines> field_lines;  // per field; may be shorter (then `line`)
  int line = 0;
  std::string assign_name;  // set for NAME=value / NAME+=value / NAME=(...)
  bool append = false;
  bool is_array = false;
};

// Accumulates the fields of one word: unquoted expansions split at blanks, quoted text never.
// Each character carries its source line: `lines` when given (a variable's value), else the
// reader's current line.
class FieldBuilder {
 public:
  explicit FieldBuilder(const int& current_line) : current_line_(current_line) {}
  void Quoted(std::string_view s, const CharLines* lines = nullptr) {
    for (size_t i = 0; i < s.size(); ++i) cur_lines_.push_back(LineOf(lines, i));
    cur_ += s;
    open_ = true;
  }
  void Unquoted(std::string_view s, const CharLines* lines = nullptr) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (IsBlank(s[i]) || s[i] == '\n') {
        Close();
      } else {
        cur_ += s[i];
        cur_lines_.push_back(LineOf(lines, i));
        open_ = true;
      }
    }
  }
  void Close() {
    if (open_) {
      fields_.push_back(cur_);
      lines_.push_back(cur_lines_);
    }
    cur_.clear();
    cur_lines_.clear();
    open_ = false;
  }
  std::vector<std::string> Take() {
    Close();
    return std::move(fields_);
  }
  // The lines of the fields Take returned.
  std::vector<CharLines> TakeLines() { return std::move(lines_); }
  size_t Bytes() const { return cur_.size(); }
  size_t Fields() const { return fields_.size(); }
  bool HasText() const { return !cur_.empty() || !fields_.empty(); }
  // The last blank-separated token written ("--num-layers" of "--num-layers "), or the last field.
  std::string LastToken() const {
    if (cur_.empty()) return fields_.empty() ? std::string() : fields_.back();
    size_t e = cur_.size();
    while (e > 0 && (IsBlank(cur_[e - 1]) || cur_[e - 1] == '\n')) --e;
    size_t s = e;
    while (s > 0 && !IsBlank(cur_[s - 1]) && cur_[s - 1] != '\n') --s;
    return cur_.substr(s, e - s);
  }

 private:
  int LineOf(const CharLines* lines, size_t i) const {
    return lines != nullptr && i < lines->size() ? (*lines)[i] : current_line_;
  }

  const int& current_line_;
  std::string cur_;
  CharLines cur_lines_;
  bool open_ = false;
  std::vector<std::string> fields_;
  std::vector<CharLines> lines_;
};

// Joins fields with single blanks, as an assignment's value is one string; the lines follow.
std::pair<std::string, CharLines> JoinFields(const std::vector<std::string>& fields,
                                             const std::vector<CharLines>& lines) {
  std::string text;
  CharLines out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) {
      text += ' ';
      out.push_back(out.empty() ? 0 : out.back());
    }
    text += fields[i];
    const CharLines& l = i < lines.size() ? lines[i] : CharLines();
    for (size_t c = 0; c < fields[i].size(); ++c) {
      out.push_back(c < l.size() ? l[c] : (out.empty() ? 0 : out.back()));
    }
  }
  return {text, out};
}

// ---- bash's arithmetic (bash(1) "ARITHMETIC EVALUATION"; bash's expr.c) ----
// 64-bit integers that wrap as bash's do on every platform it runs launch scripts on: + - * and
// ** are computed in uint64_t and converted back (C++20 defines that conversion modulo 2^64);
// INT64_MIN / -1 is INT64_MIN and INT64_MIN % -1 is 0 (expr.c handles both before dividing).
// What bash refuses (division by zero) is an error; what it computes differently by CPU (a shift
// by 64 or more) or refuses with a message (a negative exponent, an assignment) is "not
// evaluated". `&&`, `||` and `?:` skip their unused side as bash does.
class ShellArithParser {
 public:
  enum class Error { kNone, kMissingOperand, kSyntax, kDivisionByZero, kTooDeep };
  // `variable(name, evaluated)` gives a name's value (and warns when it has none, if evaluated).
  ShellArithParser(std::string_view e,
                   std::function<std::int64_t(const std::string&, bool)> variable)
      : e_(e), variable_(std::move(variable)) {}

  std::int64_t Run() {
    const std::int64_t v = Comma();
    Skip();
    if (i_ != e_.size()) Set(Error::kSyntax);
    return error_ == Error::kNone ? v : 0;
  }
  Error error() const { return error_; }

 private:
  using U = std::uint64_t;
  struct Op {
    std::string_view text;
    int prec = 0;
  };

  void Set(Error e) {
    if (error_ == Error::kNone) error_ = e;
  }
  void Skip() {
    while (i_ < e_.size() && (IsBlank(e_[i_]) || e_[i_] == '\n')) ++i_;
  }
  bool Eat(char c) {
    Skip();
    if (i_ < e_.size() && e_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  // The binary operator at i_ (longest match), prec 0 when none. An assignment ("+=", "=") is
  // none, so that the parse stops there and the expression is "not evaluated".
  Op PeekOp() {
    Skip();
    static constexpr Op kOps[] = {{"**", 11}, {"<<", 8}, {">>", 8}, {"<=", 7}, {">=", 7},
                                  {"==", 6},  {"!=", 6}, {"&&", 2}, {"||", 1}, {"*", 10},
                                  {"/", 10},  {"%", 10}, {"+", 9},  {"-", 9},  {"<", 7},
                                  {">", 7},   {"&", 5},  {"^", 4},  {"|", 3}};
    const std::string_view rest = e_.substr(i_);
    for (const Op& op : kOps) {
      if (!rest.starts_with(op.text)) continue;
      const bool assigns = rest.size() > op.text.size() && rest[op.text.size()] == '=' &&
                           op.text != "==" && op.text != "!=" && op.text != "<=" && op.text != ">=";
      return assigns ? Op{} : op;
    }
    return {};
  }

  std::int64_t Comma() {
    std::int64_t v = Ternary();
    while (error_ == Error::kNone && Eat(',')) v = Ternary();
    return v;
  }
  std::int64_t Ternary() {
    const std::int64_t c = Binary(1);
    std::int64_t v = c;
    if (Eat('?')) {
      if (!Enter()) return 0;
      noeval_ += c == 0 ? 1 : 0;
      const std::int64_t a = Ternary();
      noeval_ -= c == 0 ? 1 : 0;
      if (!Eat(':')) Set(Error::kSyntax);
      noeval_ += c != 0 ? 1 : 0;
      const std::int64_t b = Ternary();
      noeval_ -= c != 0 ? 1 : 0;
      v = c != 0 ? a : b;
      --depth_;
    }
    return v;
  }
  std::int64_t Binary(int min_prec) {
    std::int64_t lhs = Unary();
    for (;;) {
      const Op op = PeekOp();
      if (op.prec == 0 || op.prec < min_prec || error_ != Error::kNone) return lhs;
      i_ += op.text.size();
      const bool logical = op.text == "&&" || op.text == "||";
      const bool skip = logical && ((op.text == "&&") == (lhs == 0));
      noeval_ += skip ? 1 : 0;
      std::int64_t rhs = 0;
      if (op.text == "**") {  // right-associative: each one a level deeper
        if (!Enter()) return 0;
        rhs = Binary(op.prec);
        --depth_;
      } else {
        rhs = Binary(op.prec + 1);
      }
      noeval_ -= skip ? 1 : 0;
      lhs = logical ? static_cast<std::int64_t>(op.text == "&&" ? (lhs != 0 && rhs != 0)
                                                                : (lhs != 0 || rhs != 0))
                    : Apply(op.text, lhs, rhs);
    }
  }
  bool Enter() {
    if (++depth_ <= kLaunchScriptMaxNesting) return true;
    Set(Error::kTooDeep);
    --depth_;
    return false;
  }
  std::int64_t Apply(std::string_view op, std::int64_t a, std::int64_t b);
  std::int64_t Unary();
  std::int64_t UnaryOperand();
  std::int64_t Number();
  std::int64_t Name();

  std::string_view e_;
  std::function<std::int64_t(const std::string&, bool)> variable_;
  size_t i_ = 0;
  int depth_ = 0;
  int noeval_ = 0;  // > 0 inside the unused side of && || ?:
  Error error_ = Error::kNone;
};

std::int64_t ShellArithParser::Apply(std::string_view op, std::int64_t a, std::int64_t b) {
  const U ua = static_cast<U>(a);
  const U ub = static_cast<U>(b);
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  if (op == "+") return static_cast<std::int64_t>(ua + ub);
  if (op == "-") return static_cast<std::int64_t>(ua - ub);
  if (op == "*") return static_cast<std::int64_t>(ua * ub);
  if (op == "/" || op == "%") {
    if (b == 0) {
      if (noeval_ == 0) Set(Error::kDivisionByZero);
      return 0;
    }
    if (a == kMin && b == -1) return op == "/" ? kMin : 0;  // expr.c: no trap
    return op == "/" ? a / b : a % b;
  }
  if (op == "**") {
    if (b < 0) {
      if (noeval_ == 0) Set(Error::kSyntax);  // bash: "exponent less than 0"
      return 0;
    }
    U result = 1;
    for (U base = ua, n = ub; n != 0; n >>= 1, base *= base) {
      if ((n & 1) != 0) result *= base;
    }
    return static_cast<std::int64_t>(result);
  }
  if (op == "<<" || op == ">>") {
    if (b < 0 || b > 63) {  // bash shifts by the C operator: by the CPU's rule past 63
      if (noeval_ == 0) Set(Error::kSyntax);
      return 0;
    }
    return op == "<<" ? static_cast<std::int64_t>(ua << b) : a >> b;
  }
  if (op == "<") return a < b;
  if (op == "<=") return a <= b;
  if (op == ">") return a > b;
  if (op == ">=") return a >= b;
  if (op == "==") return a == b;
  if (op == "!=") return a != b;
  if (op == "&") return static_cast<std::int64_t>(ua & ub);
  if (op == "^") return static_cast<std::int64_t>(ua ^ ub);
  return static_cast<std::int64_t>(ua | ub);  // "|"
}

std::int64_t ShellArithParser::Unary() {
  if (!Enter()) return 0;
  const std::int64_t v = UnaryOperand();
  --depth_;
  return v;
}

std::int64_t ShellArithParser::UnaryOperand() {
  Skip();
  if (i_ >= e_.size() || e_[i_] == ')' || e_[i_] == ':' || e_[i_] == ',') {
    Set(Error::kMissingOperand);  // `$((2+))`
    return 0;
  }
  const char c = e_[i_];
  const bool doubled = i_ + 1 < e_.size() && e_[i_ + 1] == c;
  if ((c == '-' || c == '+') && doubled) {  // ++x / --x assign: not evaluated
    Set(Error::kSyntax);
    return 0;
  }
  if (c == '-' || c == '+' || c == '!' || c == '~') {
    ++i_;
    const std::int64_t v = Unary();
    if (c == '-') return static_cast<std::int64_t>(U{0} - static_cast<U>(v));
    if (c == '!') return v == 0;
    return c == '~' ? ~v : v;
  }
  if (c == '(') {
    ++i_;
    const std::int64_t v = Comma();
    if (!Eat(')')) Set(Error::kSyntax);
    return v;
  }
  if (c >= '0' && c <= '9') return Number();
  if (IsNameStart(c)) return Name();
  Set(Error::kSyntax);
  return 0;
}

// A constant: decimal, 0x hex, 0 octal or BASE#digits (2..36), wrapping as bash's does.
std::int64_t ShellArithParser::Number() {
  U base = 10;
  if (e_[i_] == '0' && i_ + 1 < e_.size() && (e_[i_ + 1] == 'x' || e_[i_ + 1] == 'X')) {
    base = 16;
    i_ += 2;
  } else if (e_[i_] == '0') {
    base = 8;
  }
  size_t j = i_;
  while (j < e_.size() && e_[j] >= '0' && e_[j] <= '9') ++j;
  if (base == 10 && j < e_.size() && e_[j] == '#') {  // BASE#digits
    base = 0;
    for (size_t k = i_; k < j; ++k) base = std::min<U>(base * 10 + static_cast<U>(e_[k] - '0'), 99);
    if (base < 2 || base > 36) {
      Set(Error::kSyntax);
      return 0;
    }
    i_ = j + 1;
  }
  U v = 0;
  size_t digits = 0;
  for (; i_ < e_.size() && IsNameChar(e_[i_]); ++i_, ++digits) {
    const char d = static_cast<char>(std::tolower(static_cast<unsigned char>(e_[i_])));
    const U x = d >= '0' && d <= '9'   ? static_cast<U>(d - '0')
                : d >= 'a' && d <= 'z' ? static_cast<U>(d - 'a' + 10)
                                       : 99;
    if (x >= base) {
      Set(Error::kSyntax);  // "value too great for base"
      return 0;
    }
    v = v * base + x;
  }
  if (digits == 0 && base != 8) Set(Error::kSyntax);
  return static_cast<std::int64_t>(v);
}

std::int64_t ShellArithParser::Name() {
  size_t j = i_;
  while (j < e_.size() && IsNameChar(e_[j])) ++j;
  const std::string name(e_.substr(i_, j - i_));
  i_ = j;
  Skip();
  const std::string_view rest = e_.substr(i_);
  if (rest.starts_with("++") || rest.starts_with("--") || rest.starts_with("[") ||
      (rest.starts_with("=") && !rest.starts_with("=="))) {
    Set(Error::kSyntax);  // x++, A[i], x=1: not evaluated
    return 0;
  }
  return variable_(name, noeval_ == 0);
}

// ---- glob patterns (bash(1) "Pattern Matching": * ? [...] and \x) ----
// Whether the bracket expression at p[i] ('[') matches c; i ends past ']'. A '[' without ']'
// is a literal '['.
bool ShellGlobBracket(std::string_view p, size_t& i, char c) {
  size_t j = i + 1;
  const bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
  if (negate) ++j;
  bool match = false;
  bool first = true;
  for (; j < p.size() && (first || p[j] != ']'); ++j, first = false) {
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      match |= c >= p[j] && c <= p[j + 2];
      j += 2;
    } else {
      match |= c == p[j];
    }
  }
  if (j >= p.size()) {  // no ']': a literal '['
    ++i;
    return c == '[';
  }
  i = j + 1;
  return match != negate;
}

// Whether `s` matches the whole pattern `p`: the usual greedy match with one backtrack point
// (the last '*'), O(|p|·|s|).
bool ShellGlob(std::string_view p, std::string_view s) {
  size_t pi = 0;
  size_t si = 0;
  size_t star = std::string_view::npos;
  size_t star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = ++pi;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      size_t next = pi + 1;
      bool ok = false;
      if (p[pi] == '?') {
        ok = true;
      } else if (p[pi] == '[') {
        next = pi;
        ok = ShellGlobBracket(p, next, s[si]);
      } else if (p[pi] == '\\' && pi + 1 < p.size()) {
        ok = p[pi + 1] == s[si];
        next = pi + 2;
      } else {
        ok = p[pi] == s[si];
      }
      if (ok) {
        pi = next;
        ++si;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// The most character comparisons one pattern match may cost (|pattern| x |value|, squared
// value for ${x%pat}, which tries every cut): memsim's bound, past which the match is "not
// evaluated" rather than slow.
constexpr size_t kShellGlobWork = size_t{1} << 26;

bool ShellHasGlob(std::string_view p) { return p.find_first_of("*?[\\") != std::string_view::npos; }

// ${x%p} ${x%%p} ${x#p} ${x##p}: the shortest / longest matching suffix / prefix removed.
std::string ShellTrim(const std::string& s, std::string_view op, std::string_view p) {
  const bool suffix = op[0] == '%';
  const bool longest = op.size() == 2;
  const size_t n = s.size();
  for (size_t k = 0; k <= n; ++k) {
    const size_t len = longest ? n - k : k;  // the length of the part removed
    const std::string_view part =
        suffix ? std::string_view(s).substr(n - len) : std::string_view(s).substr(0, len);
    if (ShellHasGlob(p) ? ShellGlob(p, part) : part == p) {
      return suffix ? s.substr(0, n - len) : s.substr(len);
    }
  }
  return s;
}

// The status of a command as memsim knows it: true (0), false (1), or unknown (a command it does
// not run, a test on a file).
enum class ShellStatus { kTrue, kFalse, kUnknown };
ShellStatus ShellNot(ShellStatus s) {
  return s == ShellStatus::kUnknown ? s
         : s == ShellStatus::kTrue  ? ShellStatus::kFalse
                                    : ShellStatus::kTrue;
}
ShellStatus ShellAnd(ShellStatus a, ShellStatus b) {
  if (a == ShellStatus::kFalse || b == ShellStatus::kFalse) return ShellStatus::kFalse;
  return a == ShellStatus::kTrue && b == ShellStatus::kTrue ? ShellStatus::kTrue
                                                            : ShellStatus::kUnknown;
}
ShellStatus ShellOr(ShellStatus a, ShellStatus b) {
  return ShellNot(ShellAnd(ShellNot(a), ShellNot(b)));
}
ShellStatus ShellKnown(bool b) { return b ? ShellStatus::kTrue : ShellStatus::kFalse; }

class ScriptReader {
 public:
  ScriptReader(const std::string& label, std::string_view text, std::vector<std::string> args,
               const std::vector<ScriptVariable>& pinned)
      : text_(text), positional_(std::move(args)), args_known_(!positional_.empty()) {
    out_.label = label;
    out_.kind = MegatronLaunch::Kind::kScript;
    for (const ScriptVariable& v : pinned) {
      pinned_.erase(v.name);  // a later --script-var of the same name wins
      SetVariable(v.name, {v.value}, {}, false, 0);
      pinned_[v.name] = Pinned{v.value, {}, false};
    }
  }

  MegatronLaunch Read() {
    RunSource();
    TellPinned();
    if (!found_) {
      throw InputError(fmt::format(
          "{}: no training command found (expected a line running torchrun, python -m "
          "torch.distributed.run, msrun or python with a pretrain_*.py script){}",
          out_.label,
          exit_line_ > 0 ? fmt::format("; the script exits at line {}", exit_line_) : ""));
    }
    FillWorldFromVariables();
    for (auto [list, dropped] :
         {std::pair{&out_.warnings, dropped_warnings_}, std::pair{&out_.notes, dropped_notes_}}) {
      if (dropped > 0) list->push_back(fmt::format("{}: {} more not shown", out_.label, dropped));
    }
    return std::move(out_);
  }

 private:
  struct Var {
    std::vector<std::string> values;
    std::vector<CharLines> lines;  // per element; an element's may be empty (then unknown)
    size_t bytes = 0;
  };
  struct Function {
    std::shared_ptr<const std::string> body;
    int line = 0;
  };
  enum class BlockKind { kIf, kCase, kLoop, kFunction, kGroup };
  // kRun: its commands run; kCond: an if/elif condition runs; kSeek: no branch taken yet;
  // kDone: a branch was taken; kPattern: a case item's patterns are next; kSkip: not run.
  enum class BlockState { kRun, kCond, kSeek, kDone, kPattern, kSkip };
  struct Block {
    BlockKind kind = BlockKind::kGroup;
    bool live = true;  // the code around it ran when it opened
    BlockState state = BlockState::kRun;
    int line = 0;
    std::string subject;   // case: the word matched
    bool matched = false;  // case: an item matched; function: defined (opened in running code)
    std::string name;      // function
    size_t body_start = 0;
    int body_line = 0;
  };
  struct Source {
    std::string_view text;
    size_t pos = 0;
    int line = 0;
  };
  struct Heredoc {
    std::string delimiter;
    bool strip_tabs = false;
    int line = 0;
  };
  // One nesting level (a call, an eval, a nested expansion); refused past the bound.
  class Nest {
   public:
    Nest(ScriptReader& r, int line) : r_(r) {
      if (++r_.depth_ > kLaunchScriptMaxNesting) {
        r_.Fail(line, fmt::format("nested deeper than {} levels (memsim's bound for a launch "
                                  "script)",
                                  kLaunchScriptMaxNesting));
      }
    }
    ~Nest() { --r_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    ScriptReader& r_;
  };

  // ---- characters and sources ----
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  void Advance() {
    if (text_[pos_] == '\n') ++line_;
    ++pos_;
  }
  [[noreturn]] void Fail(int line, const std::string& what) const {
    throw InputError(fmt::format("{}:{}: {}", out_.label, line, what));
  }
  void Keep(std::vector<std::string>& list, size_t& dropped, std::string w) {
    if (!list.empty() && list.back() == w) return;
    if (list.size() >= kLaunchScriptMaxWarnings) {
      ++dropped;
      return;
    }
    list.push_back(std::move(w));
  }
  void Warn(int line, const std::string& what) {
    Keep(out_.warnings, dropped_warnings_, fmt::format("{}:{}: {}", out_.label, line, what));
  }
  void Note(int line, const std::string& what) {
    Keep(out_.notes, dropped_notes_, fmt::format("{}:{}: {}", out_.label, line, what));
  }
  Source Swap(std::string_view text, int line) {
    Source saved{text_, pos_, line_};
    text_ = text;
    pos_ = 0;
    line_ = line;
    return saved;
  }
  void Restore(const Source& s) {
    text_ = s.text;
    pos_ = s.pos;
    line_ = s.line;
  }
  void RunSource() {
    while (pos_ < text_.size() && !exiting_ && !returning_) ReadCommand();
  }
  // Skips blanks and backslash-newline continuations; a '#' at a word start skips the comment.
  void SkipBlanks() {
    for (;;) {
      if (IsBlank(Peek())) {
        Advance();
      } else if (Peek() == '\\' && Peek(1) == '\n') {
        Advance();
        Advance();
      } else if (Peek() == '#') {
        while (pos_ < text_.size() && Peek() != '\n') Advance();
      } else {
        return;
      }
    }
  }
  void SkipBlankLines() {
    for (SkipBlanks(); Peek() == '\n'; SkipBlanks()) Advance();
  }
  // The word at pos_ up to the next operator or blank, unexpanded ("" at one).
  std::string_view BareWord() const {
    size_t j = pos_;
    while (j < text_.size() && !EndsWord(text_[j])) ++j;
    return text_.substr(pos_, j - pos_);
  }
  void SkipChars(size_t n) {
    for (size_t k = 0; k < n && pos_ < text_.size(); ++k) Advance();
  }

  // ---- running or not ----
  static bool Runs(const Block& b) {
    return b.live && (b.state == BlockState::kRun || b.state == BlockState::kCond);
  }
  bool Active() const {
    return std::all_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return Runs(b); });
  }
  // Whether the command being read runs (so that its expansions are done).
  bool Evaluating() const { return !skip_command_ && Active(); }
  void Open(Block b) {
    if (blocks_.size() >= static_cast<size_t>(kLaunchScriptMaxNesting)) {
      Fail(b.line, fmt::format("blocks nested deeper than {} levels (memsim's bound for a launch "
                               "script)",
                               kLaunchScriptMaxNesting));
    }
    blocks_.push_back(std::move(b));
  }
  bool Top(BlockKind k) const { return !blocks_.empty() && blocks_.back().kind == k; }
  static Block MakeBlock(BlockKind kind, bool live, BlockState state, int line) {
    Block b;
    b.kind = kind;
    b.live = live;
    b.state = state;
    b.line = line;
    return b;
  }

  // ---- expansions ----
  // The text between `open` (at pos_) and its matching `close`, nesting counted; pos_ ends past
  // the closing character.
  std::string Balanced(char open, char close) {
    const int start_line = line_;
    Advance();  // open
    std::string body;
    int depth = 1;
    while (pos_ < text_.size()) {
      const char c = Peek();
      if (c == '\'' || c == '"') {  // quotes inside: copied through unchanged
        body += c;
        Advance();
        while (pos_ < text_.size() && Peek() != c) {
          if (c == '"' && Peek() == '\\') {
            body += Peek();
            Advance();
          }
          if (pos_ < text_.size()) {
            body += Peek();
            Advance();
          }
        }
        if (pos_ >= text_.size()) break;
      } else if (c == close && --depth == 0) {  // before `open`: a '`' closes what '`' opened
        Advance();
        return body;
      } else if (c == open) {
        ++depth;
      }
      body += Peek();
      Advance();
    }
    Fail(start_line, fmt::format("unterminated '{}' (no matching '{}')", open, close));
  }
  // The expression of `$((...))` / `((...))`, pos_ past the "((": up to the "))" that closes it.
  std::string ArithBody(int line) {
    std::string body;
    int depth = 0;
    while (pos_ < text_.size()) {
      const char c = Peek();
      if (c == ')' && depth == 0) {
        if (Peek(1) != ')') break;  // `$((2*(3+4))`: bash refuses it
        SkipChars(2);
        return body;
      }
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      body += c;
      Advance();
    }
    Fail(line, fmt::format("unterminated $(({} (no matching '))')", Printable(body, 40)));
  }

  // A variable's elements; nullptr when unset.
  const Var* Lookup(const std::string& name) const {
    if (const auto p = pinned_.find(name); p != pinned_.end()) p->second.read = true;
    auto it = vars_.find(name);
    return it == vars_.end() ? nullptr : &it->second;
  }
  static bool IsDigits(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  }
  // A parameter's value: a variable, a positional parameter ($0 the script, $1 ...), $@ $* $#;
  // nullopt when unset (or a script argument the caller did not give).
  std::optional<std::vector<std::string>> Find(const std::string& name) const {
    if (IsDigits(name)) {
      if (name == "0") return std::vector<std::string>{out_.label};
      const size_t k = name.size() > 6 ? SIZE_MAX : static_cast<size_t>(std::stoul(name));
      if (k == 0) return std::vector<std::string>{out_.label};
      if (k > positional_.size()) return std::nullopt;
      return std::vector<std::string>{positional_[k - 1]};
    }
    if (name == "@" || name == "*" || name == "#") {
      if (!args_known_ && call_depth_ == 0) return std::nullopt;
      if (name == "#") return std::vector<std::string>{std::to_string(positional_.size())};
      return positional_;
    }
    const Var* v = Lookup(name);
    if (v == nullptr) return std::nullopt;
    return v->values;
  }
  std::vector<std::string> UnsetValue(const std::string& name, int line) {
    const bool positional = IsDigits(name) || name == "@" || name == "*" || name == "#";
    if (positional && (args_known_ || call_depth_ > 0)) return {};  // given: fewer than that
    if (positional) {
      Warn(line, fmt::format("${} is a script argument, not known here; taken as empty", name));
    } else {
      Warn(line, fmt::format("${} is not set in the script (a value from the environment); "
                             "taken as empty",
                             name));
    }
    return {};
  }
  // The lines of variable `name`'s elements, for the expansion Dollar returns.
  void SetLastLines(const std::string& name) {
    const Var* v = Lookup(name);
    if (v != nullptr && v->lines.size() == v->values.size()) {
      last_lines_ = v->lines;
    } else {
      last_lines_.clear();
    }
  }

  // Expands `s` (a default word, an arithmetic expression, a pattern) as an assignment's value:
  // quotes removed, expansions done, no word splitting. Read in place (the variables are not
  // copied), one nesting level deeper.
  std::string ExpandString(std::string_view s, int line) {
    Nest nest(*this, line);
    const Source saved = Swap(s, line);
    const std::vector<std::string> fields = ReadFreeText();
    Restore(saved);
    std::string out;
    for (const std::string& x : fields) {
      out += (out.empty() ? "" : " ") + x;
    }
    return out;
  }
  std::vector<std::string> ReadFreeText() {
    FieldBuilder b(line_);
    while (pos_ < text_.size()) {
      if (EndsWord(Peek())) {
        b.Quoted(std::string_view(&text_[pos_], 1));
        Advance();
      } else {
        ReadWordPart(b);
      }
      CheckBuilder(b);
    }
    return b.Take();
  }
  void CheckBuilder(const FieldBuilder& b) const {
    if (b.Bytes() > kLaunchScriptMaxWordBytes) {
      Fail(line_, fmt::format("a word longer than {} KiB (memsim's bound for a launch script)",
                              kLaunchScriptMaxWordBytes >> 10));
    }
    if (b.Fields() > kLaunchScriptMaxElements) {
      Fail(line_, fmt::format("a word of more than {} fields (memsim's bound for a launch script)",
                              kLaunchScriptMaxElements));
    }
  }

  // $NAME, ${...}, $((...)), $(...) at pos_ ('$' not yet consumed).
  std::vector<std::string> Dollar() {
    const int line = line_;
    const bool eval = Evaluating();
    last_lines_.clear();
    Advance();  // $
    if (Peek() == '(' && Peek(1) == '(') {
      SkipChars(2);
      const std::string expr = ArithBody(line);
      if (!eval) return {};
      return {std::to_string(Arithmetic(ExpandString(expr, line), line))};
    }
    if (Peek() == '(') {
      const std::string cmd = Balanced('(', ')');
      if (eval) {
        Warn(line, fmt::format("$({}) not evaluated (memsim runs no command); taken as empty",
                               Printable(cmd, 40)));
      }
      return {};
    }
    if (Peek() == '{') {
      const std::string body = Balanced('{', '}');
      if (!eval) return {};
      return Brace(body, line);
    }
    std::string name;
    if (IsNameStart(Peek())) {
      while (IsNameChar(Peek())) {
        name += Peek();
        Advance();
      }
    } else if (std::string_view("0123456789@*#?$!-").find(Peek()) != std::string_view::npos &&
               Peek() != '\0') {
      name = Peek();
      Advance();
    } else {
      return {"$"};
    }
    if (!eval) return {};
    if (name == "?" || name == "$" || name == "!" || name == "-") {
      Warn(line, fmt::format("${} not evaluated (memsim runs no command); taken as empty", name));
      return {};
    }
    std::optional<std::vector<std::string>> v = Find(name);
    if (!v) return UnsetValue(name, line);
    SetLastLines(name);
    return std::move(*v);
  }

  // ${...}: NAME, NAME[i], NAME[@], #NAME, then :- - := = :+ + :? ? % %% # ## :off:len.
  std::vector<std::string> Brace(const std::string& body, int line) {
    if (body.size() > 1 && body[0] == '#' && body != "#-" &&
        body.find_first_of(":-=+?%/") == std::string::npos) {
      return BraceLength(body.substr(1), line);
    }
    size_t i = 0;
    if (!body.empty() && (body[0] == '@' || body[0] == '*' || body[0] == '#')) {
      i = 1;
    } else if (!body.empty() && body[0] >= '0' && body[0] <= '9') {
      while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i;
    } else {
      while (i < body.size() && IsNameChar(body[i])) ++i;
    }
    const std::string name = body.substr(0, i);
    std::string index;
    if (i < body.size() && body[i] == '[' && !name.empty()) {
      const size_t close = body.find(']', i);
      if (close == std::string::npos)
        Fail(line, fmt::format("unterminated ${{{}", Printable(body)));
      index = body.substr(i + 1, close - i - 1);
      i = close + 1;
    }
    if (name.empty()) {
      Warn(line, fmt::format("${{{}}} not evaluated; taken as empty", Printable(body)));
      return {};
    }
    all_elements_ = index == "@" || name == "@";
    std::optional<std::vector<std::string>> v = Element(name, index, line);
    if (i >= body.size()) {
      if (!v) return Lookup(name) != nullptr ? std::vector<std::string>{} : UnsetValue(name, line);
      if (index.empty() || index == "@" || index == "*") SetLastLines(name);
      return std::move(*v);
    }
    return BraceOperator(name, std::move(v), body, i, line);
  }
  // NAME[index]: one element (arithmetic index, negative from the end), or all for @ and *.
  std::optional<std::vector<std::string>> Element(const std::string& name, const std::string& index,
                                                  int line) {
    std::optional<std::vector<std::string>> v = Find(name);
    if (index.empty() || index == "@" || index == "*" || !v) return v;
    std::int64_t k = Arithmetic(ExpandString(index, line), line);
    const auto n = static_cast<std::int64_t>(v->size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return std::nullopt;
    return std::vector<std::string>{(*v)[static_cast<size_t>(k)]};
  }
  std::vector<std::string> BraceLength(const std::string& rest, int line) {
    const bool count = rest.ends_with("[@]") || rest.ends_with("[*]");
    const std::string name = count ? rest.substr(0, rest.size() - 3) : rest;
    if (name.empty() || !(IsDigits(name) || std::all_of(name.begin(), name.end(), IsNameChar))) {
      Warn(line, fmt::format("${{#{}}} not evaluated; taken as 0", Printable(rest)));
      return {"0"};
    }
    const std::optional<std::vector<std::string>> v = Find(name);
    if (!v) {
      UnsetValue(name, line);
      return {"0"};
    }
    if (count) return {std::to_string(v->size())};
    return {std::to_string(v->empty() ? 0 : (*v)[0].size())};
  }
  std::vector<std::string> BraceOperator(const std::string& name,
                                         std::optional<std::vector<std::string>> v,
                                         const std::string& body, size_t i, int line) {
    const bool colon = body[i] == ':';
    const char op = colon && i + 1 < body.size() ? body[i + 1] : body[i];
    if (std::string_view("-=+?").find(op) != std::string_view::npos && op != '\0') {
      const std::string word = body.substr(i + (colon ? 2 : 1));
      return BraceDefault(name, std::move(v), colon, op, word, line);
    }
    if (colon)
      return BraceSubstring(v.value_or(std::vector<std::string>{}), body.substr(i + 1), line);
    if (op == '%' || op == '#') {
      const bool twice = i + 1 < body.size() && body[i + 1] == op;
      const std::string pattern = ExpandString(body.substr(i + (twice ? 2 : 1)), line);
      std::vector<std::string> values = v.value_or(std::vector<std::string>{});
      for (std::string& x : values) {
        if (x.size() * x.size() * std::max<size_t>(1, pattern.size()) > kShellGlobWork &&
            ShellHasGlob(pattern)) {
          Warn(line, fmt::format("${{{}}} on a value of {} bytes not evaluated; the value taken",
                                 Printable(body, 40), x.size()));
          continue;
        }
        x = ShellTrim(x, twice ? std::string(2, op) : std::string(1, op), pattern);
      }
      return values;
    }
    Warn(line, fmt::format("${{{}}} not evaluated; taken as empty", Printable(body)));
    return {};
  }
  std::vector<std::string> BraceDefault(const std::string& name,
                                        std::optional<std::vector<std::string>> v, bool colon,
                                        char op, const std::string& word, int line) {
    const bool empty = !v || v->empty() || (v->size() == 1 && (*v)[0].empty());
    const bool unset = colon ? empty : !v.has_value();
    if (op == '+')
      return unset ? std::vector<std::string>{} : std::vector{ExpandString(word, line)};
    if (!unset) {
      SetLastLines(name);
      return std::move(*v);
    }
    const std::string value = ExpandString(word, line);
    if (op == '?') {
      Warn(line, fmt::format("${} is not set (bash stops here with '{}'); taken as empty", name,
                             Printable(value, 40)));
      return {};
    }
    if (op == '=') {
      if (IsDigits(name) || !IsNameStart(name[0])) {
        Fail(line,
             fmt::format("${{{}{}=...}}: ${} cannot be assigned", name, colon ? ":" : "", name));
      }
      SetVariable(name, {value}, {}, false, line);
    }
    Note(line,
         fmt::format("${} not set in the script, its default '{}' taken", name, Printable(value)));
    return {value};
  }
  // ${x:off} / ${x:off:len} (characters), ${A[@]:off:len} (elements); a negative offset counts
  // from the end, a negative length ends that far from the end.
  std::vector<std::string> BraceSubstring(std::vector<std::string> v, const std::string& spec,
                                          int line) {
    const size_t colon = spec.find(':');
    const std::int64_t off = Arithmetic(ExpandString(spec.substr(0, colon), line), line);
    std::optional<std::int64_t> len;
    if (colon != std::string::npos)
      len = Arithmetic(ExpandString(spec.substr(colon + 1), line), line);
    auto range = [&](std::int64_t n) -> std::pair<size_t, size_t> {
      std::int64_t b = off < 0 ? std::max<std::int64_t>(0, n + off) : std::min(off, n);
      if (off < -n) b = n;  // bash: an offset before the start gives nothing
      std::int64_t e = n;
      if (len) e = *len < 0 ? n + *len : (*len > n - b ? n : b + *len);
      return {static_cast<size_t>(b), static_cast<size_t>(std::max(b, std::min(e, n)))};
    };
    if (all_elements_) {
      const auto [b, e] = range(static_cast<std::int64_t>(v.size()));
      return std::vector<std::string>(v.begin() + static_cast<std::ptrdiff_t>(b),
                                      v.begin() + static_cast<std::ptrdiff_t>(e));
    }
    const std::string s = v.empty() ? std::string() : v[0];
    const auto [b, e] = range(static_cast<std::int64_t>(s.size()));
    return {s.substr(b, e - b)};
  }

  // ---- arithmetic ----
  std::int64_t Arithmetic(const std::string& expr, int line) {
    Nest nest(*this, line);
    ShellArithParser parser(expr, [&](const std::string& name, bool evaluated) {
      return ArithVariable(name, evaluated, line);
    });
    const std::int64_t v = parser.Run();
    switch (parser.error()) {
      case ShellArithParser::Error::kNone:
        return v;
      case ShellArithParser::Error::kTooDeep:
        Fail(line, fmt::format("$(({})) nested deeper than {} levels (memsim's bound for a launch "
                               "script)",
                               Printable(expr, 40), kLaunchScriptMaxNesting));
      case ShellArithParser::Error::kDivisionByZero:
        Fail(line, fmt::format("division by zero in $(({})) (bash stops the script here)",
                               Printable(expr, 40)));
      case ShellArithParser::Error::kMissingOperand:
        Warn(line, fmt::format("$(({})) not evaluated (an operand is missing); taken as 0",
                               Printable(expr, 40)));
        return 0;
      case ShellArithParser::Error::kSyntax:
        break;
    }
    Warn(line, fmt::format("$(({})) not evaluated; taken as 0", Printable(expr, 40)));
    return 0;
  }
  std::int64_t ArithVariable(const std::string& name, bool evaluated, int line) {
    const Var* v = Lookup(name);
    if (v == nullptr || v->values.empty()) {
      if (evaluated)
        Warn(line, fmt::format("{} in $((...)) is not set in the script; taken as 0", name));
      return 0;
    }
    const std::string& value = v->values[0];
    if (value.empty()) return 0;  // bash: an empty variable is 0
    const std::optional<std::int64_t> n = ParseInt(value);
    if (!n && evaluated) {
      Warn(line, fmt::format("{}='{}' in $((...)) is not a number; taken as 0", name,
                             Printable(value, 40)));
    }
    return n.value_or(0);
  }

  // ---- words ----
  // The inside of "..." (pos_ past the opening quote) up to the closing quote.
  void ReadQuotedBody(FieldBuilder& b) {
    const int start = line_;
    while (pos_ < text_.size() && Peek() != '"') {
      const char c = Peek();
      if (c == '\\' && std::string_view("$`\"\\\n").find(Peek(1)) != std::string_view::npos &&
          Peek(1) != '\0') {
        Advance();
        if (Peek() != '\n') b.Quoted(std::string_view(&text_[pos_], 1));
        Advance();
      } else if (c == '$') {
        QuotedExpansion(b);
        CheckBuilder(b);
      } else if (c == '`') {
        Balanced('`', '`');
        if (Evaluating())
          Warn(line_, "`...` not evaluated (memsim runs no command); taken as empty");
        b.Quoted("");  // "`cmd`" is one field, empty here, as "$(cmd)" is
      } else {
        b.Quoted(std::string_view(&text_[pos_], 1));
        Advance();
      }
    }
    if (pos_ >= text_.size()) Fail(start, "unterminated double quote");
    Advance();
  }
  // "$X" keeps the value as one field; "${A[@]}" makes one field per element.
  void QuotedExpansion(FieldBuilder& b) {
    const size_t start = pos_;
    const int line = line_;
    all_elements_ = Peek(1) == '@';
    std::vector<std::string> v = Dollar();
    const std::vector<CharLines> lines = std::move(last_lines_);
    MaybeHint(b, start, line, v);
    if (all_elements_) {
      for (size_t k = 0; k < v.size(); ++k) {
        if (k > 0) b.Close();
        b.Quoted(v[k], k < lines.size() ? &lines[k] : nullptr);
      }
      if (v.empty()) b.Quoted("");
      return;
    }
    const auto [joined, joined_lines] = JoinFields(v, lines);
    b.Quoted(joined, &joined_lines);
  }
  // An expansion at text_[start, pos_) that gave nothing right after a --flag: a hint for an
  // error about that flag's value.
  void MaybeHint(const FieldBuilder& b, size_t start, int line, const std::vector<std::string>& v) {
    if (!Evaluating() ||
        std::any_of(v.begin(), v.end(), [](const std::string& x) { return !x.empty(); })) {
      return;
    }
    const std::string flag = b.HasText() ? b.LastToken() : prev_field_;
    if (!flag.starts_with("--") || (flag.find('=') != std::string::npos && !flag.ends_with("="))) {
      return;
    }
    const std::string_view src = text_.substr(start, pos_ - start);
    size_t n = src.starts_with("${") ? 2 : 1;
    size_t e = n;
    while (e < src.size() && IsNameChar(src[e])) ++e;
    const std::string name(src.substr(n, e - n));
    std::string why = "an empty value";
    if (!name.empty() && (e == src.size() || src[e] == '}')) {
      why = Find(name) ? fmt::format("{} is empty", name) : fmt::format("{} is not set", name);
    }
    Keep(out_.hints, dropped_hints_,
         fmt::format("{}:{}: {}: its value {} expanded to nothing ({})", out_.label, line,
                     flag.substr(0, flag.find('=')), Printable(src, 40), why));
  }

  // One word at pos_ (not blank). Sets w.assign_name for an assignment when `allow_assign`.
  Word ReadWord(bool allow_assign) {
    Word w;
    w.line = line_;
    if (allow_assign && IsNameStart(Peek())) ReadAssignmentName(w);
    if (!w.assign_name.empty() && Peek() == '(') {
      w.is_array = true;
      w.fields = ReadArray(w.field_lines);
      return w;
    }
    FieldBuilder b(line_);
    if (!w.assign_name.empty()) b.Quoted("");  // NAME= is an empty value, not no value
    while (pos_ < text_.size() && !EndsWord(Peek())) {
      ReadWordPart(b);
      CheckBuilder(b);
    }
    w.fields = b.Take();
    w.field_lines = b.TakeLines();
    if (!w.assign_name.empty()) {  // assignments do not split
      auto [joined, lines] = JoinFields(w.fields, w.field_lines);
      w.fields = {std::move(joined)};
      w.field_lines = {std::move(lines)};
    }
    if (!w.fields.empty()) prev_field_ = w.fields.back();
    return w;
  }
  void ReadAssignmentName(Word& w) {
    size_t j = pos_;
    while (j < text_.size() && IsNameChar(text_[j])) ++j;
    const bool append = j + 1 < text_.size() && text_[j] == '+' && text_[j + 1] == '=';
    if (j < text_.size() && (text_[j] == '=' || append)) {
      w.assign_name = std::string(text_.substr(pos_, j - pos_));
      w.append = append;
      SkipChars(j - pos_ + (append ? 2 : 1));
    }
  }
  void ReadWordPart(FieldBuilder& b) {
    const char c = Peek();
    if (c == '\\') {
      Advance();
      if (Peek() == '\n') {
        Advance();
        return;
      }
      if (pos_ < text_.size()) {
        b.Quoted(std::string_view(&text_[pos_], 1));
        Advance();
      }
    } else if (c == '\'') {
      const int start = line_;
      Advance();
      const size_t close = text_.find('\'', pos_);
      if (close == std::string_view::npos) Fail(start, "unterminated single quote");
      b.Quoted(text_.substr(pos_, close - pos_));
      SkipChars(close + 1 - pos_);
    } else if (c == '"') {
      Advance();
      ReadQuotedBody(b);
    } else if (c == '$') {
      const size_t start = pos_;
      const int line = line_;
      const std::vector<std::string> v = Dollar();
      const std::vector<CharLines> lines = std::move(last_lines_);
      MaybeHint(b, start, line, v);
      for (size_t k = 0; k < v.size(); ++k) {
        if (k > 0) b.Close();  // array elements are separate fields
        b.Unquoted(v[k], k < lines.size() ? &lines[k] : nullptr);
      }
    } else if (c == '`') {
      Balanced('`', '`');
      if (Evaluating()) Warn(line_, "`...` not evaluated (memsim runs no command); taken as empty");
    } else {
      b.Unquoted(std::string_view(&text_[pos_], 1));
      Advance();
    }
  }
  // NAME=( ... ): words up to the matching ')', across lines, comments allowed.
  std::vector<std::string> ReadArray(std::vector<CharLines>& elem_lines) {
    const int start = line_;
    Advance();  // (
    std::vector<std::string> elems;
    for (;;) {
      SkipBlanks();
      if (pos_ >= text_.size()) Fail(start, "unterminated array '(' (no matching ')')");
      if (Peek() == ')') {
        Advance();
        return elems;
      }
      if (Peek() == '\n') {
        Advance();
        continue;
      }
      FieldBuilder b(line_);
      while (pos_ < text_.size() && !EndsWord(Peek())) {
        ReadWordPart(b);
        CheckBuilder(b);
      }
      for (std::string& f : b.Take()) elems.push_back(std::move(f));
      for (CharLines& l : b.TakeLines()) elem_lines.push_back(std::move(l));
      if (!elems.empty()) prev_field_ = elems.back();
      if (elems.size() > kLaunchScriptMaxElements) {
        Fail(start, fmt::format("an array of more than {} elements (memsim's bound for a launch "
                                "script)",
                                kLaunchScriptMaxElements));
      }
      if (pos_ < text_.size() && EndsWord(Peek()) && !IsBlank(Peek()) && Peek() != '\n' &&
          Peek() != ')') {
        Advance();  // stray operator inside an array: skipped
      }
    }
  }

  // ---- commands ----
  // Skips a redirection at pos_ ("> f", ">> f", "2>&1", "< f", "&> f", "<<EOF", "<<< word").
  bool SkipRedirection() {
    size_t j = pos_;
    while (j < text_.size() && text_[j] >= '0' && text_[j] <= '9') ++j;
    if (j < text_.size() && text_[j] == '&' && j + 1 < text_.size() && text_[j + 1] == '>') ++j;
    if (j >= text_.size() || (text_[j] != '>' && text_[j] != '<')) return false;
    const bool heredoc = text_.substr(j).starts_with("<<") && !text_.substr(j).starts_with("<<<");
    SkipChars(j + 1 - pos_);
    if (heredoc) return ReadHeredocStart();
    while (Peek() == '>' || Peek() == '<') Advance();
    if (Peek() == '&') {
      Advance();
      while (IsNameChar(Peek()) || Peek() == '-') Advance();
      return true;
    }
    SkipBlanks();
    if (pos_ < text_.size() && !EndsWord(Peek())) {
      const bool skip = std::exchange(skip_command_, true);  // a file name: not expanded
      ReadWord(false);
      skip_command_ = skip;
    }
    return true;
  }
  // "<<[-]WORD" (pos_ past the first '<'): the here-document's lines are skipped at the end of
  // the line.
  bool ReadHeredocStart() {
    Advance();  // the second '<'
    Heredoc h{"", Peek() == '-', line_};
    if (h.strip_tabs) Advance();
    SkipBlanks();
    while (pos_ < text_.size() && !EndsWord(Peek())) {
      if (Peek() != '\'' && Peek() != '"' && Peek() != '\\') h.delimiter += Peek();
      Advance();
    }
    heredocs_.push_back(std::move(h));
    return true;
  }
  // After a newline: the pending here-documents' bodies, each up to its delimiter line.
  void SkipHeredocs() {
    for (const Heredoc& h : heredocs_) {
      for (;;) {
        if (pos_ >= text_.size()) {
          Warn(h.line, fmt::format("here-document ended by the end of the file, not '{}'",
                                   Printable(h.delimiter, 40)));
          break;
        }
        const size_t eol = std::min(text_.find('\n', pos_), text_.size());
        std::string_view l = text_.substr(pos_, eol - pos_);
        while (h.strip_tabs && l.starts_with('\t')) l.remove_prefix(1);
        SkipChars(eol + 1 - pos_);
        if (l == h.delimiter) break;
      }
    }
    heredocs_.clear();
  }
  // The separator at pos_: "\n", ";", ";;" (also ";&", ";;&"), "&", "&&", "|", "||". After
  // "&&", "||" and "|" the next command may start on a later line.
  std::string ReadSeparator() {
    const char c = Peek();
    Advance();
    std::string sep(1, c);
    if (c == ';' && (Peek() == ';' || Peek() == '&')) {
      sep = ";;";
      while (Peek() == ';' || Peek() == '&') Advance();
    } else if ((c == '&' || c == '|') && Peek() == c) {
      sep += c;
      Advance();
    } else if (c == '|' && Peek() == '&') {
      Advance();
    }
    if (sep == "&&" || sep == "||" || sep == "|") SkipBlankLines();
    if (c == '\n') SkipHeredocs();
    return sep;
  }

  // Reads one command (up to a separator) and runs it when the code around it runs.
  void ReadCommand() {
    if (++commands_ > kLaunchScriptMaxCommands) {
      Fail(line_, fmt::format("more than {} commands run (memsim's bound for a launch script; a "
                              "function that calls itself?)",
                              kLaunchScriptMaxCommands));
    }
    if (Top(BlockKind::kCase) && blocks_.back().state == BlockState::kPattern) ReadCasePatterns();
    std::vector<Word> words;
    negate_ = false;
    command_status_.reset();
    prev_field_.clear();
    for (;;) {
      SkipBlanks();
      if (pos_ >= text_.size()) return EndCommand(words, "");
      const char c = Peek();
      if (SkipRedirection()) continue;
      if (c == '\n' || c == ';' || c == '&' || c == '|') return EndCommand(words, ReadSeparator());
      if (words.empty() && ReadReserved()) continue;
      if (c == '(' || c == ')') {
        if (c == '(' && Peek(1) == ')' && words.size() == 1 && words[0].assign_name.empty()) {
          SkipChars(2);
          DefineFunction(words[0].fields.empty() ? "" : words[0].fields[0], words[0].line);
          words.clear();
          continue;
        }
        Advance();
        continue;
      }
      const bool assign_ok = AllAssignments(words) || IsDeclaration(words);
      words.push_back(ReadWord(assign_ok));
    }
  }
  // Runs the command read (when it runs), then applies the separator after it.
  void EndCommand(std::vector<Word>& words, std::string_view sep) {
    if (Evaluating() && (command_status_ || !words.empty())) {
      const ShellStatus s = command_status_ ? *command_status_ : Execute(words);
      last_status_ = negate_ ? ShellNot(s) : s;
    }
    skip_command_ = false;
    // A command memsim does not run is taken to succeed: `cmd || exit 1` goes on.
    if (sep == "&&") skip_command_ = last_status_ == ShellStatus::kFalse;
    if (sep == "||") skip_command_ = last_status_ != ShellStatus::kFalse;
    if (sep == ";;" && Top(BlockKind::kCase)) blocks_.back().state = BlockState::kPattern;
  }
  static bool AllAssignments(const std::vector<Word>& w) {
    return std::all_of(w.begin(), w.end(), [](const Word& x) { return !x.assign_name.empty(); });
  }
  static bool IsDeclaration(const std::vector<Word>& w) {
    if (w.empty() || w[0].fields.empty()) return false;
    const std::string& f = w[0].fields[0];
    return f == "export" || f == "declare" || f == "local" || f == "readonly" || f == "typeset";
  }
  // The command word `w` stands for; "" for an assignment.
  static std::string First(const Word& w) {
    return w.fields.empty() || !w.assign_name.empty() ? "" : w.fields[0];
  }

  // ---- control ----
  // A reserved word at the start of a command (bash(1) "RESERVED WORDS"), handled here; false
  // when the command starts with something else.
  bool ReadReserved() {
    if (Peek() == '(' && Peek(1) == '(') {  // (( expr ))
      const int line = line_;
      SkipChars(2);
      const std::string expr = ArithBody(line);
      command_status_ = Evaluating() ? ShellKnown(Arithmetic(ExpandString(expr, line), line) != 0)
                                     : ShellStatus::kUnknown;
      return true;
    }
    const std::string w(BareWord());
    static const std::set<std::string, std::less<>> kReserved = {
        "if",    "then",   "elif", "else", "fi",       "case", "esac", "for", "while",
        "until", "select", "do",   "done", "function", "{",    "}",    "!",   "[["};
    if (!kReserved.contains(w)) return false;
    const int line = line_;
    SkipChars(w.size());
    if (w == "[[") {
      command_status_ = ReadDoubleBracket(line);
    } else if (w == "!") {
      negate_ = !negate_;
    } else if (w == "function") {
      SkipBlanks();
      const std::string name(BareWord());
      SkipChars(name.size());
      SkipBlanks();
      if (Peek() == '(' && Peek(1) == ')') SkipChars(2);
      DefineFunction(name, line);
    } else if (w == "case") {
      ReadCaseHead(line);
    } else {
      IfOrBlockWord(w, line);
    }
    return true;
  }
  void IfOrBlockWord(const std::string& w, int line) {
    if (w == "if") {
      Open(MakeBlock(BlockKind::kIf, Evaluating(), BlockState::kCond, line));
    } else if (w == "then" && Top(BlockKind::kIf)) {
      Block& b = blocks_.back();
      if (b.state == BlockState::kCond) b.state = Taken(b);
    } else if ((w == "elif" || w == "else") && Top(BlockKind::kIf)) {
      BlockState& s = blocks_.back().state;
      s = s == BlockState::kRun || s == BlockState::kDone ? BlockState::kDone
          : w == "else"                                   ? BlockState::kRun
                                                          : BlockState::kCond;
    } else if (w == "fi" && Top(BlockKind::kIf)) {
      blocks_.pop_back();
    } else if (w == "esac" && Top(BlockKind::kCase)) {
      blocks_.pop_back();
    } else if (w == "for" || w == "while" || w == "until" || w == "select") {
      if (Evaluating()) Warn(line, fmt::format("'{}' loop not evaluated; skipped", w));
      Open(MakeBlock(BlockKind::kLoop, false, BlockState::kSkip, line));
    } else if (w == "done" && Top(BlockKind::kLoop)) {
      blocks_.pop_back();
    } else if (w == "{") {
      Open(MakeBlock(BlockKind::kGroup, Evaluating(), BlockState::kRun, line));
    } else if (w == "}" && Top(BlockKind::kFunction)) {
      EndFunction();
    } else if (w == "}" && Top(BlockKind::kGroup)) {
      blocks_.pop_back();
    }
  }
  // The branch state after an if/elif condition's status.
  BlockState Taken(const Block& b) {
    if (!b.live) return BlockState::kSkip;
    if (last_status_ == ShellStatus::kUnknown) {
      Warn(b.line, "'if' condition not evaluated; the first branch taken");
      return BlockState::kRun;
    }
    return last_status_ == ShellStatus::kTrue ? BlockState::kRun : BlockState::kSeek;
  }

  // NAME() { ... } / function NAME { ... } (pos_ past the name and "()"): the body is kept as
  // text, read when the function is called.
  void DefineFunction(const std::string& name, int line) {
    SkipBlankLines();
    if (!(Peek() == '{' && (IsBlank(Peek(1)) || Peek(1) == '\n'))) {
      if (Evaluating())
        Warn(line, fmt::format("function {}: a body other than {{ ... }} not evaluated",
                               Printable(name, 40)));
      return;
    }
    Advance();
    Block b = MakeBlock(BlockKind::kFunction, false, BlockState::kSkip, line);
    b.matched = Evaluating();
    b.name = name;
    b.body_start = pos_;
    b.body_line = line_;
    Open(std::move(b));
  }
  void EndFunction() {
    const Block b = std::move(blocks_.back());
    blocks_.pop_back();
    if (!b.matched || b.name.empty()) return;
    const size_t end = pos_ - 1;  // the '}'
    functions_[b.name] = {
        std::make_shared<const std::string>(text_.substr(b.body_start, end - b.body_start)),
        b.body_line};
  }

  // case WORD in (pos_ past "case").
  void ReadCaseHead(int line) {
    const bool live = Evaluating();
    SkipBlanks();
    const Word w = pos_ < text_.size() && !EndsWord(Peek()) ? ReadWord(false) : Word{};
    SkipBlankLines();
    if (BareWord() != "in") Fail(line, "'case' without 'in'");
    SkipChars(2);
    std::string subject;
    for (const std::string& f : w.fields) subject += (subject.empty() ? "" : " ") + f;
    Block b = MakeBlock(BlockKind::kCase, live, BlockState::kPattern, line);
    b.subject = std::move(subject);
    Open(std::move(b));
  }
  // At a case item: `esac`, or PATTERN|PATTERN) whose commands run when one matches and no
  // item before did.
  void ReadCasePatterns() {
    SkipBlankLines();
    if (pos_ >= text_.size()) return;
    if (BareWord() == "esac") return;  // read as a reserved word
    Block b = std::move(blocks_.back());
    blocks_.pop_back();  // the patterns expand as the code around the case does
    const bool live = b.live && !b.matched && Active();
    const bool skip = std::exchange(skip_command_, !live);
    if (Peek() == '(') Advance();
    bool match = false;
    for (;;) {
      SkipBlanks();
      if (pos_ >= text_.size()) Fail(b.line, "'case' item without ')'");
      const char c = Peek();
      if (c == ')') {
        Advance();
        break;
      }
      if (EndsWord(c)) {
        Advance();
        continue;
      }
      const Word w = ReadWord(false);
      const std::string p = w.fields.empty() ? std::string() : w.fields[0];
      if (live && !match && p.size() * b.subject.size() > kShellGlobWork) {
        Warn(w.line, "a 'case' pattern on a long value not evaluated; taken as not matching");
      } else {
        match = match || (live && ShellGlob(p, b.subject));
      }
    }
    skip_command_ = skip;
    b.state = match ? BlockState::kRun : BlockState::kSkip;
    b.matched = b.matched || match;
    blocks_.push_back(std::move(b));
  }

  // ---- tests: [ ], test, [[ ]] (bash(1) "CONDITIONAL EXPRESSIONS") ----
  // [[ ... ]] (pos_ past "[["): its words unsplit, && || ( ) < > as operators.
  ShellStatus ReadDoubleBracket(int line) {
    std::vector<std::string> args;
    for (;;) {
      SkipBlanks();
      if (pos_ >= text_.size()) Fail(line, "unterminated '[[' (no matching ']]')");
      if (Peek() == '\n') {
        Advance();
        continue;
      }
      if (Peek() == ']' && Peek(1) == ']' && (pos_ + 2 >= text_.size() || EndsWord(Peek(2)))) {
        SkipChars(2);
        break;
      }
      const std::string_view two = text_.substr(pos_, 2);
      if (two == "&&" || two == "||") {
        args.emplace_back(two);
        SkipChars(2);
      } else if (EndsWord(Peek())) {
        args.emplace_back(1, Peek());
        Advance();
      } else {
        const Word w = ReadWord(false);
        args.push_back(JoinFields(w.fields, w.field_lines).first);
      }
      if (args.size() > kLaunchScriptMaxElements) Fail(line, "a '[[ ]]' of too many words");
    }
    if (!Evaluating()) return ShellStatus::kUnknown;
    return Test(args, true, line);
  }
  struct TestInput {
    const std::vector<std::string>& a;
    size_t i = 0;
    bool dbl = false;  // [[ ]]: && || and glob matching
    int line = 0;
    bool More() const { return i < a.size(); }
    bool At(std::string_view s) const { return i < a.size() && a[i] == s; }
  };
  ShellStatus Test(const std::vector<std::string>& args, bool dbl, int line) {
    TestInput in{args, 0, dbl, line};
    const ShellStatus s = TestOr(in);
    if (in.More()) {
      Warn(line, fmt::format("test '{}' not evaluated (unexpected '{}')",
                             Printable(Joined(args), 60), Printable(args[in.i], 20)));
      return ShellStatus::kUnknown;
    }
    return s;
  }
  static std::string Joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
    return s;
  }
  ShellStatus TestOr(TestInput& in) {
    ShellStatus s = TestAnd(in);
    while (in.At(in.dbl ? "||" : "-o")) {
      ++in.i;
      s = ShellOr(s, TestAnd(in));
    }
    return s;
  }
  ShellStatus TestAnd(TestInput& in) {
    ShellStatus s = TestNot(in);
    while (in.At(in.dbl ? "&&" : "-a")) {
      ++in.i;
      s = ShellAnd(s, TestNot(in));
    }
    return s;
  }
  ShellStatus TestNot(TestInput& in) {
    Nest nest(*this, in.line);
    if (in.At("!") && in.i + 1 < in.a.size()) {
      ++in.i;
      return ShellNot(TestNot(in));
    }
    if (in.At("(") && in.i + 1 < in.a.size()) {
      ++in.i;
      const ShellStatus s = TestOr(in);
      if (in.At(")")) ++in.i;
      return s;
    }
    return TestPrimary(in);
  }
  static bool IsBinaryTest(const std::string& op) {
    static const std::set<std::string, std::less<>> kOps = {"=",   "==",  "!=",  "<",   ">",
                                                            "-eq", "-ne", "-lt", "-le", "-gt",
                                                            "-ge", "=~",  "-nt", "-ot", "-ef"};
    return kOps.contains(op);
  }
  ShellStatus TestPrimary(TestInput& in) {
    const std::vector<std::string>& a = in.a;
    if (!in.More()) return ShellStatus::kFalse;
    if (in.i + 2 < a.size() && IsBinaryTest(a[in.i + 1])) {
      in.i += 3;
      return TestBinary(a[in.i - 3], a[in.i - 2], a[in.i - 1], in);
    }
    const std::string& x = a[in.i];
    if (x.size() == 2 && x[0] == '-' && in.i + 1 < a.size() && !IsBinaryTest(x)) {
      in.i += 2;
      const std::string& arg = a[in.i - 1];
      if (x == "-z") return ShellKnown(arg.empty());
      if (x == "-n") return ShellKnown(!arg.empty());
      if (x == "-v") return ShellKnown(Find(arg).has_value());
      // A script checks that what it needs is there and stops when it is not (`[ ! -f
      // pretrain_gpt.py ] && exit 1`): the file is taken to exist, and this is said.
      Warn(in.line, fmt::format("'{} {}' tests a file or the terminal (memsim reads only the "
                                "script); taken as true",
                                x, Printable(arg, 40)));
      return ShellStatus::kTrue;
    }
    ++in.i;
    return ShellKnown(!x.empty());
  }
  ShellStatus TestBinary(const std::string& l, const std::string& op, const std::string& r,
                         const TestInput& in) {
    if (op == "=" || op == "==" || op == "!=") {
      if (in.dbl && ShellHasGlob(r) && r.size() * l.size() > kShellGlobWork) {
        Warn(in.line, fmt::format("'{} {} {}' on a long value not evaluated", Printable(l, 30), op,
                                  Printable(r, 30)));
        return ShellStatus::kUnknown;
      }
      const bool eq = in.dbl ? ShellGlob(r, l) : l == r;
      return ShellKnown(eq == (op != "!="));
    }
    if (op == "<" || op == ">") return ShellKnown(op == "<" ? l < r : l > r);
    if (op == "=~") {
      Warn(in.line, fmt::format("'{} =~ {}' (a regular expression) not evaluated", Printable(l, 30),
                                Printable(r, 30)));
      return ShellStatus::kUnknown;
    }
    const std::optional<std::int64_t> x = ParseInt(l);
    const std::optional<std::int64_t> y = ParseInt(r);
    const bool file = op == "-nt" || op == "-ot" || op == "-ef";
    if (!x || !y || file) {
      Warn(in.line, fmt::format("'{} {} {}' not evaluated{}", Printable(l, 30), op,
                                Printable(r, 30), file ? " (a file test)" : " (not integers)"));
      return ShellStatus::kUnknown;
    }
    if (op == "-eq") return ShellKnown(*x == *y);
    if (op == "-ne") return ShellKnown(*x != *y);
    if (op == "-lt") return ShellKnown(*x < *y);
    if (op == "-le") return ShellKnown(*x <= *y);
    if (op == "-gt") return ShellKnown(*x > *y);
    return ShellKnown(*x >= *y);  // -ge
  }

  // ---- running a command ----
  ShellStatus Execute(std::vector<Word>& words) {
    size_t i = 0;
    for (; i < words.size() && !words[i].assign_name.empty(); ++i) Assign(words[i]);
    if (i == words.size()) return ShellStatus::kTrue;
    // Wrappers that run the rest as a command.
    while (i + 1 < words.size() && (First(words[i]) == "nohup" || First(words[i]) == "exec" ||
                                    First(words[i]) == "time" || First(words[i]) == "env")) {
      ++i;
    }
    if (IsDeclaration(words)) {
      const bool exported = First(words[0]) == "export";
      for (size_t k = 1; k < words.size(); ++k) {
        if (!words[k].assign_name.empty()) Assign(words[k]);
        if (exported) Export(words[k]);
      }
      return ShellStatus::kTrue;
    }
    std::vector<std::pair<std::string, int>> fields;
    for (size_t k = i; k < words.size(); ++k) {
      // Each field on the line it is written on (inside an argument group, not the launch line).
      const Word& w = words[k];
      for (size_t j = 0; j < w.fields.size(); ++j) {
        const bool known = j < w.field_lines.size() && !w.field_lines[j].empty();
        fields.emplace_back(w.fields[j], known ? w.field_lines[j][0] : w.line);
      }
    }
    if (fields.empty()) return ShellStatus::kTrue;
    if (fields.size() > kLaunchScriptMaxElements)
      Fail(words[i].line, "a command of too many words");
    if (std::optional<ShellStatus> s = Builtin(fields, words[i].line)) return *s;
    if (MaybeTrainingCommand(fields)) {
      for (size_t k = 0; k < i; ++k) Export(words[k]);  // NAME=value torchrun ...
    }
    return ShellStatus::kUnknown;
  }
  // The commands memsim evaluates; nullopt for the others.
  std::optional<ShellStatus> Builtin(const std::vector<std::pair<std::string, int>>& f, int line) {
    const std::string& cmd = f[0].first;
    std::vector<std::string> args;
    for (size_t k = 1; k < f.size(); ++k) args.push_back(f[k].first);
    if (cmd == "[" || cmd == "test") {
      if (cmd == "[" && (args.empty() || args.back() != "]")) {
        Warn(line, "'[' without ']' not evaluated");
        return ShellStatus::kUnknown;
      }
      if (cmd == "[") args.pop_back();
      return Test(args, false, line);
    }
    if (cmd == "true" || cmd == ":") return ShellStatus::kTrue;
    if (cmd == "false") return ShellStatus::kFalse;
    if (cmd == "exit" || cmd == "return") {
      (cmd == "exit" || call_depth_ == 0 ? exiting_ : returning_) = true;
      if (cmd == "exit" || call_depth_ == 0) exit_line_ = line;
      const std::optional<std::int64_t> n =
          args.empty() ? std::optional<std::int64_t>(0) : ParseInt(args[0]);
      return n ? ShellKnown(*n == 0) : ShellStatus::kUnknown;
    }
    if (cmd == "shift") {
      const std::optional<std::int64_t> n =
          args.empty() ? std::optional<std::int64_t>(1) : ParseInt(args[0]);
      if (!n || *n < 0 || static_cast<size_t>(*n) > positional_.size()) return ShellStatus::kFalse;
      positional_.erase(positional_.begin(), positional_.begin() + static_cast<std::ptrdiff_t>(*n));
      return ShellStatus::kTrue;
    }
    if (cmd == "set" && !args.empty() && args[0] == "--") {
      positional_.assign(args.begin() + 1, args.end());
      args_known_ = true;
      return ShellStatus::kTrue;
    }
    if (cmd == "unset") {
      for (const std::string& a : args) UnsetVariable(a, line);
      return ShellStatus::kTrue;
    }
    if (cmd == "eval") return Eval(args, line);
    if (cmd == "source" || cmd == ".") {
      Warn(line, fmt::format("'{}' not followed (memsim reads only this file)", cmd));
      return ShellStatus::kUnknown;
    }
    const auto fn = functions_.find(cmd);
    if (fn != functions_.end()) return Call(fn->second, std::move(args), line);
    return std::nullopt;
  }
  // A function's body read with $1 ... set to `args`; blocks, $@ and `return` its own.
  ShellStatus Call(Function fn, std::vector<std::string> args, int line) {
    Nest nest(*this, line);
    const Source saved = Swap(*fn.body, fn.line);
    std::vector<std::string> saved_args = std::exchange(positional_, std::move(args));
    std::vector<Block> saved_blocks = std::exchange(blocks_, {});
    ++call_depth_;
    last_status_ = ShellStatus::kTrue;
    RunSource();
    --call_depth_;
    returning_ = false;
    blocks_ = std::move(saved_blocks);
    positional_ = std::move(saved_args);
    Restore(saved);
    return last_status_;
  }
  // eval ARGS: the words joined with blanks, read as script text on the eval's line.
  ShellStatus Eval(const std::vector<std::string>& args, int line) {
    Nest nest(*this, line);
    const std::string text = Joined(args);
    const Source saved = Swap(text, line);
    std::vector<Block> saved_blocks = std::exchange(blocks_, {});
    last_status_ = ShellStatus::kTrue;
    RunSource();
    blocks_ = std::move(saved_blocks);
    Restore(saved);
    return last_status_;
  }

  // ---- variables ----
  void Assign(const Word& w) {
    if (SkipPinned(w.assign_name, w.line)) return;
    if (!w.append || w.is_array) {
      SetVariable(w.assign_name, w.fields, w.field_lines, w.append, w.line);
      return;
    }
    Var& v = vars_[w.assign_name];  // NAME+=word: appended to the last element
    const std::string add = w.fields.empty() ? "" : w.fields[0];
    if (v.lines.size() != v.values.size()) v.lines.assign(v.values.size(), CharLines());
    if (v.values.empty()) {
      v.values.emplace_back();
      v.lines.emplace_back();
    }
    v.values.back() += add;
    if (!w.field_lines.empty()) {
      v.lines.back().insert(v.lines.back().end(), w.field_lines[0].begin(), w.field_lines[0].end());
    }
    Grew(w.assign_name, v, add.size(), w.line);
  }
  void SetVariable(const std::string& name, const std::vector<std::string>& values,
                   const std::vector<CharLines>& lines, bool append, int line) {
    if (SkipPinned(name, line)) return;
    Var& v = vars_[name];
    if (!append) {
      total_bytes_ -= v.bytes;
      v = Var();
    }
    if (v.lines.size() != v.values.size()) v.lines.assign(v.values.size(), CharLines());
    size_t added = 0;
    for (size_t k = 0; k < values.size(); ++k) {
      v.values.push_back(values[k]);
      v.lines.push_back(k < lines.size() ? lines[k] : CharLines());
      added += values[k].size();
    }
    Grew(name, v, added, line);
  }
  // Counts `added` bytes to `name`'s value and checks the bounds.
  void Grew(const std::string& name, Var& v, size_t added, int line) {
    v.bytes += added;
    total_bytes_ += added;
    if (!v.values.empty() && v.values.back().size() > kLaunchScriptMaxWordBytes) {
      Fail(line, fmt::format("{}: a value longer than {} KiB (memsim's bound for a launch script)",
                             Printable(name, 40), kLaunchScriptMaxWordBytes >> 10));
    }
    if (v.values.size() > kLaunchScriptMaxElements) {
      Fail(line, fmt::format("{}: an array of more than {} elements (memsim's bound for a launch "
                             "script)",
                             Printable(name, 40), kLaunchScriptMaxElements));
    }
    if (total_bytes_ > kLaunchScriptMaxTotalBytes) {
      Fail(line, fmt::format("the script's variables hold more than {} MiB (memsim's bound for a "
                             "launch script)",
                             kLaunchScriptMaxTotalBytes >> 20));
    }
  }
  // True (and the line recorded) when `name` is pinned by --script-var: the assignment is skipped.
  bool SkipPinned(const std::string& name, int line) {
    const auto p = pinned_.find(name);
    if (p == pinned_.end()) return false;
    if (p->second.skipped_lines.size() < 20) p->second.skipped_lines.push_back(line);
    return true;
  }
  // One warning per pinned variable: where the script's own assignments were skipped, or that the
  // script never uses it (a misspelt name would otherwise change nothing without a word).
  void TellPinned() {
    for (const auto& [name, p] : pinned_) {
      const std::string given = fmt::format("--script-var {}={}", name, Printable(p.value, 40));
      if (!p.skipped_lines.empty()) {
        out_.warnings.push_back(fmt::format("{}: {}: the script's own assignment{} at line{} {} "
                                            "skipped",
                                            out_.label, given, p.skipped_lines.size() > 1 ? "s" : "",
                                            p.skipped_lines.size() > 1 ? "s" : "",
                                            fmt::join(p.skipped_lines, ", ")));
      } else if (!p.read) {
        out_.warnings.push_back(fmt::format("{}: {}: the script neither sets nor reads ${}; it "
                                            "changes nothing",
                                            out_.label, given, name));
      } else {
        out_.warnings.push_back(fmt::format("{}: {}: set before the script's first line",
                                            out_.label, given));
      }
    }
  }
  void UnsetVariable(const std::string& name, int line) {
    if (SkipPinned(name, line)) return;
    const auto it = vars_.find(name);
    if (it == vars_.end()) return;
    total_bytes_ -= it->second.bytes;
    vars_.erase(it);
  }

  // Records `export NAME=value` / `export NAME` (a variable set before) as the environment.
  void Export(const Word& w) {
    std::string name = w.assign_name;
    if (name.empty() && w.fields.size() == 1 && !w.fields[0].empty() &&
        IsNameStart(w.fields[0][0])) {
      name = w.fields[0];
    }
    const Var* v = name.empty() ? nullptr : Lookup(name);
    if (v == nullptr) return;
    out_.exports.push_back({name, Joined(v->values), w.line});
  }

  // ---- the training command ----
  static bool IsLauncher(const std::vector<std::pair<std::string, int>>& f, size_t i) {
    const std::string name = std::filesystem::path(f[i].first).filename().string();
    if (name == "torchrun" || name == "msrun") return true;
    return (name.starts_with("python")) && i + 2 < f.size() && f[i + 1].first == "-m" &&
           (f[i + 2].first == "torch.distributed.run" ||
            f[i + 2].first == "torch.distributed.launch");
  }

  // True when `f` is the training command (the first one, read into out_).
  bool MaybeTrainingCommand(const std::vector<std::pair<std::string, int>>& f) {
    size_t script = f.size();
    for (size_t k = 0; k < f.size(); ++k) {
      if (f[k].first.ends_with(".py") && !(k > 0 && f[k - 1].first == "-m")) {
        script = k;
        break;
      }
    }
    if (script == f.size()) return false;
    const bool launcher = IsLauncher(f, 0);
    const std::string first = std::filesystem::path(f[0].first).filename().string();
    if (!launcher && !first.starts_with("python") && script != 0) return false;
    if (found_) {
      Warn(f[0].second,
           fmt::format("a second training command; the first (line {}) is read", out_.launch_line));
      return false;
    }
    found_ = true;
    out_.launch_line = f[0].second;
    if (launcher) ReadLauncherOptions(f, script);
    for (size_t k = script + 1; k < f.size(); ++k) AddArgumentWord(f[k].first, f[k].second);
    return true;
  }

  void ReadLauncherOptions(const std::vector<std::pair<std::string, int>>& f, size_t end) {
    const bool msrun = std::filesystem::path(f[0].first).filename() == "msrun";
    for (size_t k = 1; k < end; ++k) {
      std::string name = f[k].first;
      std::string value = k + 1 < end ? f[k + 1].first : "";
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (name.starts_with("--")) std::replace(name.begin() + 2, name.end(), '-', '_');
      std::optional<int>* dst = nullptr;
      if (name == (msrun ? "--local_worker_num" : "--nproc_per_node")) dst = &out_.nproc_per_node;
      if (name == (msrun ? "--worker_num" : "--nnodes")) dst = &out_.nnodes;
      if (dst == nullptr) continue;
      const bool inline_value = f[k].first.find('=') != std::string::npos;
      if (value.empty() || (!inline_value && value.starts_with("-"))) {
        // `--nproc_per_node $GPUS` with GPUS empty: bash passes no value; the world size is then
        // the variables' or --set's (megatron_args.h), and this is said.
        Warn(f[k].second, fmt::format("{}: no value (an expansion to nothing?); the world size is "
                                      "not taken from it",
                                      name));
        continue;
      }
      bool elastic = false;
      const std::optional<int> n = WorldCount(value, &elastic);
      if (elastic) {
        Warn(f[k].second, fmt::format("{} {}: an elastic range; its minimum taken", name, value));
      }
      if (!n) Fail(f[k].second, WorldCountError(name, value, msrun));
      *dst = *n;
    }
    if (msrun && out_.nnodes && out_.nproc_per_node) {  // msrun: worker_num is the world size
      *out_.nnodes = std::max(1, *out_.nnodes / *out_.nproc_per_node);
    }
  }

  void AddArgumentWord(const std::string& word, int line) {
    if (word.starts_with("--")) {
      const size_t eq = word.find('=');
      LaunchArgument a{word.substr(0, eq), {}, line};
      if (eq != std::string::npos) a.values.push_back(word.substr(eq + 1));
      out_.arguments.push_back(std::move(a));
      return;
    }
    if (out_.arguments.empty()) {
      Warn(line, fmt::format("'{}' before the first flag; ignored", Printable(word, 40)));
      return;
    }
    out_.arguments.back().values.push_back(word);
  }

  // World size from the script's variables when the launcher did not say.
  void FillWorldFromVariables() {
    auto var_int = [&](std::initializer_list<const char*> names) -> std::optional<int> {
      for (const char* n : names) {
        const Var* v = Lookup(n);
        if (v == nullptr || v->values.empty()) continue;
        if (std::optional<std::int64_t> x = ParseInt(v->values[0]); x && *x >= 1 && *x <= 1 << 20) {
          return static_cast<int>(*x);
        }
      }
      return std::nullopt;
    };
    if (!out_.nproc_per_node) out_.nproc_per_node = var_int({"GPUS_PER_NODE", "NPUS_PER_NODE"});
    if (!out_.nnodes) out_.nnodes = var_int({"NNODES", "NUM_NODES"});
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<std::string> positional_;  // $1 ...: the script's, or a function's
  bool args_known_ = false;              // the caller gave the script's arguments
  std::map<std::string, Var> vars_;
  // --script-var: the value, the lines of the script's assignments skipped, whether it was read.
  struct Pinned {
    std::string value;
    std::vector<int> skipped_lines;
    mutable bool read = false;
  };
  std::map<std::string, Pinned> pinned_;
  std::map<std::string, Function> functions_;
  size_t total_bytes_ = 0;             // of every variable's values
  std::vector<CharLines> last_lines_;  // of the elements the last Dollar() returned, or empty
  std::vector<Block> blocks_;
  std::vector<Heredoc> heredocs_;  // started on this line, skipped after its newline
  std::string prev_field_;         // the last field of the command's previous word
  ShellStatus last_status_ = ShellStatus::kTrue;
  std::optional<ShellStatus> command_status_;  // of a [[ ]] or (( )) command being read
  bool negate_ = false;                        // the command began with '!'
  bool skip_command_ = false;                  // after `a && ` with a false, `a || ` with a true
  bool exiting_ = false;
  bool returning_ = false;
  int exit_line_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;  // Nest levels
  std::int64_t commands_ = 0;
  size_t dropped_warnings_ = 0;
  size_t dropped_notes_ = 0;
  size_t dropped_hints_ = 0;
  bool found_ = false;
  bool all_elements_ = false;  // the last expansion was "${A[@]}" or "$@": one field each
  MegatronLaunch out_;
};

// "[prefix] name ........ value" -> {name, value}; nullopt for other lines.
std::optional<std::pair<std::string, std::string>> ArgumentLine(std::string_view line) {
  const size_t dots = line.find(" ..");
  if (dots == std::string_view::npos) return std::nullopt;
  size_t start = dots;
  while (start > 0 && IsNameChar(line[start - 1])) --start;
  if (start == dots) return std::nullopt;
  size_t v = dots + 1;
  while (v < line.size() && line[v] == '.') ++v;
  while (v < line.size() && IsBlank(line[v])) ++v;
  std::string value(line.substr(v));
  while (!value.empty() && IsBlank(value.back())) value.pop_back();
  return std::make_pair(std::string(line.substr(start, dots - start)), value);
}

}  // namespace

ScriptVariable ParseScriptVariable(std::string_view text, std::string_view option) {
  const size_t eq = text.find('=');
  const std::string_view name = text.substr(0, eq);
  const bool ok = eq != std::string_view::npos && !name.empty() && IsNameStart(name[0]) &&
                  std::all_of(name.begin(), name.end(), IsNameChar);
  if (!ok) {
    throw InputError(fmt::format("{} {}: expected NAME=VALUE with NAME a shell variable name "
                                 "(letters, digits and '_', not starting with a digit)",
                                 option, Printable(text, 60)));
  }
  return {std::string(name), std::string(text.substr(eq + 1))};
}

MegatronLaunch ReadLaunchScript(const std::string& label, std::string_view text,
                                const std::vector<std::string>& script_args,
                                const std::vector<ScriptVariable>& script_vars) {
  // CRLF line ends (a script saved on Windows): bash keeps each '\r' as part of the line, so
  // `\` before CR-LF continues nothing and the training command stops at its first line (the
  // model's flags silently lost). The script is read as with LF line ends, and told.
  const size_t crlf = text.find("\r\n");
  if (crlf == std::string_view::npos) return ScriptReader(label, text, script_args, script_vars).Read();
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) lf += text[i];
  }
  MegatronLaunch out = ScriptReader(label, lf, script_args, script_vars).Read();
  const auto line =
      1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(crlf), '\n');
  out.warnings.insert(out.warnings.begin(),
                      fmt::format("{}:{}: CRLF line ends (a file saved on Windows: bash keeps each "
                                  "'\\r' in its line, so a '\\' before it continues nothing); "
                                  "read as LF line ends",
                                  label, line));
  return out;
}

bool LooksLikeArgumentsLog(std::string_view text) {
  return text.find("--- arguments ---") != std::string_view::npos;
}

MegatronLaunch ReadArgumentsLog(const std::string& label, std::string_view text) {
  MegatronLaunch out;
  out.kind = MegatronLaunch::Kind::kLog;
  out.label = label;
  std::istringstream in{std::string(text)};
  std::string line;
  int n = 0;
  bool inside = false;
  while (std::getline(in, line)) {
    ++n;
    if (!inside) {
      if (line.find("--- arguments ---") != std::string::npos) {
        inside = true;
        out.launch_line = n;
      }
      continue;
    }
    if (line.find("end of arguments") != std::string::npos) return out;
    if (std::optional<std::pair<std::string, std::string>> a = ArgumentLine(line)) {
      out.arguments.push_back({a->first, {a->second}, n});
    }
  }
  if (!inside) throw InputError(fmt::format("{}: no '---- arguments ----' block found", label));
  throw InputError(fmt::format("{}:{}: the arguments block has no 'end of arguments' line", label,
                               out.launch_line));
}

namespace {

constexpr std::string_view kCommandLineLabel = "--megatron-args";

// True when the words are a whole command (`torchrun ... pretrain_gpt.py ARGS`, `python
// pretrain_gpt.py ARGS`, or a launcher's options then the script) rather than the training
// script's arguments alone.
bool IsWholeCommand(const std::vector<std::string>& words) {
  const std::string first = std::filesystem::path(words[0]).filename().string();
  if (first == "torchrun" || first == "msrun" || first.starts_with("python")) return true;
  return std::any_of(words.begin(), words.end(), [](const std::string& w) {
    return !w.starts_with("-") && w.ends_with(".py");
  });
}

// A whole command read as a one-line launch script (each word single-quoted, so nothing is
// expanded); words before the script that start with "--" are torchrun's options.
MegatronLaunch ReadWholeCommand(const std::vector<std::string>& words) {
  std::string line = words[0].starts_with("--") ? "torchrun " : "";
  for (const std::string& w : words) {
    std::string quoted = "'";
    for (const char c : w) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += quoted + "' ";
  }
  MegatronLaunch out = ReadLaunchScript(std::string(kCommandLineLabel), line);
  out.kind = MegatronLaunch::Kind::kCommandLine;
  out.launch_line = 0;
  for (LaunchArgument& a : out.arguments) a.line = 0;
  const std::string one_line = std::string(kCommandLineLabel) + ":1: ";
  for (std::string& w : out.warnings) {
    if (w.starts_with(one_line))
      w = std::string(kCommandLineLabel) + ": " + w.substr(one_line.size());
  }
  return out;
}

}  // namespace

MegatronLaunch ReadCommandLineArguments(const std::vector<std::string>& words) {
  if (!words.empty() && IsWholeCommand(words)) return ReadWholeCommand(words);
  MegatronLaunch out;
  out.kind = MegatronLaunch::Kind::kCommandLine;
  out.label = kCommandLineLabel;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.starts_with("--")) {
      const size_t eq = w.find('=');
      // torchrun's world size among the arguments (Megatron has no flag of these names):
      // --nproc_per_node / --nproc-per-node and --nnodes, as a launch script's torchrun gives it.
      std::string name = w.substr(0, eq);
      std::replace(name.begin() + 2, name.end(), '-', '_');
      if (name == "--nproc_per_node" || name == "--nnodes") {
        const bool inline_value = eq != std::string::npos;
        if (!inline_value && i + 1 == words.size()) {
          throw InputError(fmt::format("{} {}: expected a value", kCommandLineLabel, name));
        }
        const std::string value = inline_value ? w.substr(eq + 1) : words[++i];
        bool elastic = false;
        const std::optional<int> n = WorldCount(value, &elastic);
        if (!n)
          throw InputError(
              fmt::format("{} {}", kCommandLineLabel, WorldCountError(name, value, false)));
        if (elastic) {
          out.warnings.push_back(fmt::format("{} {} {}: an elastic range; its minimum taken",
                                             kCommandLineLabel, name, value));
        }
        (name == "--nnodes" ? out.nnodes : out.nproc_per_node) = *n;
        continue;
      }
      out.arguments.push_back({w.substr(0, eq), {}, 0});
      if (eq != std::string::npos) out.arguments.back().values.push_back(w.substr(eq + 1));
    } else if (out.arguments.empty()) {
      throw InputError(
          fmt::format("--megatron-args: '{}' before the first flag", Printable(w, 40)));
    } else {
      out.arguments.back().values.push_back(w);
    }
  }
  return out;
}

// A launch script is kilobytes; an arguments log may be a whole training log. memsim's bound,
// 256 MiB (an estimate), stops a read of an endless file such as /dev/zero.
constexpr std::int64_t kMaxLaunchFileBytes = std::int64_t{1} << 28;

MegatronLaunch ReadMegatronArgsFile(const std::string& path,
                                    const std::vector<std::string>& script_args,
                                    const std::vector<ScriptVariable>& script_vars) {
  const std::optional<std::string> read =
      ReadBoundedFile(path, Printable(path), kMaxLaunchFileBytes, "a --megatron-args file");
  if (!read) {
    throw InputError(
        fmt::format("{}: cannot read the file: {}", Printable(path), WhyUnreadable(path)));
  }
  const std::string& text = *read;
  if (LooksLikeArgumentsLog(text)) {
    if (!script_vars.empty()) {
      throw InputError(fmt::format("--script-var {}: {} is a training log (it holds Megatron's "
                                   "arguments block), which has no variables to set",
                                   script_vars[0].name, Printable(path)));
    }
    return ReadArgumentsLog(Printable(path), text);
  }
  return ReadLaunchScript(Printable(path), text, script_args, script_vars);
}

}  // namespace memsim::config
