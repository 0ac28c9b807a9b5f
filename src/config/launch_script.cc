// The launch-script and training-log readers (launch_script.h). The script reader is a small
// subset of bash's grammar (bash(1): "QUOTING", "PARAMETERS", "EXPANSION", "Arrays"): words,
// quotes, parameter and arithmetic expansion, arrays, assignments and the `if` / loop / function
// structure, enough to find the training command and its arguments.
#include "config/launch_script.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/core.h>

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

class ScriptReader {
 public:
  ScriptReader(const std::string& label, std::string_view text) : text_(text) {
    out_.label = label;
    out_.kind = MegatronLaunch::Kind::kScript;
  }

  MegatronLaunch Read() {
    while (pos_ < text_.size()) ReadCommand();
    if (!found_) {
      throw InputError(fmt::format(
          "{}: no training command found (expected a line running torchrun, python -m "
          "torch.distributed.run, msrun or python with a pretrain_*.py script)",
          out_.label));
    }
    FillWorldFromVariables();
    return std::move(out_);
  }

 private:
  // ---- characters ----
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
  void Warn(int line, const std::string& what) {
    const std::string w = fmt::format("{}:{}: {}", out_.label, line, what);
    if (out_.warnings.empty() || out_.warnings.back() != w) out_.warnings.push_back(w);
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

  // A variable's value as fields ("${A[@]}" and "$A" of an array give all elements).
  const std::vector<std::string>* Lookup(const std::string& name) const {
    auto it = vars_.find(name);
    return it == vars_.end() ? nullptr : &it->second;
  }

  std::vector<std::string> UnsetValue(const std::string& name, int line) {
    const bool positional = !name.empty() && (name[0] >= '0' && name[0] <= '9');
    if (positional || name == "@" || name == "*" || name == "#") {
      Warn(line, fmt::format("${} is a script argument, not known here; taken as empty", name));
    } else {
      Warn(line, fmt::format("${} is not set in the script (a value from the environment); "
                             "taken as empty",
                             name));
    }
    return {};
  }

  // ${...}: NAME, NAME[@], NAME[*], NAME[i], NAME:-word, NAME-word, NAME:=word, NAME:+word.
  std::vector<std::string> Brace(const std::string& body, int line) {
    size_t i = 0;
    if (!body.empty() && body[0] == '#') {
      Warn(line, fmt::format("${{{}}} (a length) not evaluated; taken as 0", Printable(body)));
      return {"0"};
    }
    while (i < body.size() && (IsNameChar(body[i]) || body[i] == '@' || body[i] == '*')) ++i;
    const std::string name = body.substr(0, i);
    std::string index;
    if (i < body.size() && body[i] == '[') {
      const size_t close = body.find(']', i);
      if (close == std::string::npos) Fail(line, fmt::format("unterminated ${{{}", Printable(body)));
      index = body.substr(i + 1, close - i - 1);
      i = close + 1;
    }
    const std::vector<std::string>* v = Lookup(name);
    all_elements_ = index == "@" || name == "@";
    if (!index.empty() && index != "@" && index != "*" && v != nullptr) {
      const std::optional<std::int64_t> k = ParseInt(index);
      if (!k || *k < 0 || static_cast<size_t>(*k) >= v->size()) return {};
      return {(*v)[static_cast<size_t>(*k)]};
    }
    if (i >= body.size()) {
      if (v == nullptr) return UnsetValue(name, line);
      SetLastLines(name);
      return *v;
    }
    const std::string op = body.substr(i, body[i] == ':' && i + 1 < body.size() ? 2 : 1);
    const std::string word = body.substr(i + op.size());
    const bool empty = v == nullptr || (v->size() == 1 && (*v)[0].empty()) || v->empty();
    const bool unset = op[0] == ':' ? empty : v == nullptr;
    if (op == ":-" || op == "-" || op == ":=" || op == "=") {
      if (!unset) {
        SetLastLines(name);
        return *v;
      }
      const std::string value = ExpandString(word, line);
      if (op.back() == '=') {
        vars_[name] = {value};
        var_lines_.erase(name);
      }
      out_.notes.push_back(fmt::format("{}:{}: ${} not set in the script, its default '{}' taken",
                                       out_.label, line, name, Printable(value)));
      return {value};
    }
    if (op == ":+" || op == "+") return unset ? std::vector<std::string>{} : std::vector{ExpandString(word, line)};
    Warn(line, fmt::format("${{{}}} not evaluated; taken as empty", Printable(body)));
    return {};
  }

  // Expands `s` (a default word, an arithmetic expression) as an assignment's value: quotes
  // removed, expansions done, no word splitting.
  std::string ExpandString(const std::string& s, int line) {
    ScriptReader sub(out_.label, s);
    sub.vars_ = vars_;
    sub.line_ = line;
    FieldBuilder b(sub.line_);
    while (sub.pos_ < s.size()) {
      if (EndsWord(sub.Peek())) {
        b.Quoted(std::string(1, sub.Peek()));
        sub.Advance();
      } else {
        sub.ReadWordPart(b);
      }
    }
    for (std::string& w : sub.out_.warnings) out_.warnings.push_back(std::move(w));
    for (std::string& w : sub.out_.notes) out_.notes.push_back(std::move(w));
    std::string out;
    for (const std::string& x : b.Take()) out += (out.empty() ? "" : " ") + x;
    return out;
  }

  // $NAME, ${...}, $((...)), $(...) at pos_ ('$' not yet consumed).
  std::vector<std::string> Dollar() {
    const int line = line_;
    last_lines_.clear();
    Advance();  // $
    if (Peek() == '(' && Peek(1) == '(') {
      Advance();
      const std::string expr = Balanced('(', ')');
      if (Peek() == ')') Advance();
      return {std::to_string(Arithmetic(ExpandString(expr, line), line))};
    }
    if (Peek() == '(') {
      const std::string cmd = Balanced('(', ')');
      Warn(line, fmt::format("$({}) not evaluated (memsim runs no command); taken as empty",
                             Printable(cmd, 40)));
      return {};
    }
    if (Peek() == '{') return Brace(Balanced('{', '}'), line);
    std::string name;
    if (IsNameStart(Peek())) {
      while (IsNameChar(Peek())) {
        name += Peek();
        Advance();
      }
    } else if (std::string_view("0123456789@*#?$!").find(Peek()) != std::string_view::npos &&
               Peek() != '\0') {
      name = Peek();
      Advance();
    } else {
      return {"$"};
    }
    const std::vector<std::string>* v = Lookup(name);
    if (v == nullptr) return UnsetValue(name, line);
    SetLastLines(name);
    return *v;
  }
  // The lines of variable `name`'s elements, for the expansion Dollar returns.
  void SetLastLines(const std::string& name) {
    auto it = var_lines_.find(name);
    const std::vector<std::string>* v = Lookup(name);
    if (it != var_lines_.end() && v != nullptr && it->second.size() == v->size()) {
      last_lines_ = it->second;
    } else {
      last_lines_.clear();
    }
  }

  // ---- arithmetic: + - * / % and parentheses over integers and variable names ----
  std::int64_t Arithmetic(const std::string& expr, int line) {
    size_t i = 0;
    arith_missing_operand_ = false;
    const std::int64_t v = ArithSum(expr, i, line);
    while (i < expr.size() && IsBlank(expr[i])) ++i;
    if (i != expr.size() || arith_missing_operand_) {
      Warn(line, fmt::format("$(({})) not evaluated{}; taken as 0", Printable(expr, 40),
                             arith_missing_operand_ ? " (an operand is missing)" : ""));
      return 0;
    }
    return v;
  }
  std::int64_t ArithSum(const std::string& e, size_t& i, int line) {
    std::int64_t v = ArithProduct(e, i, line);
    for (;;) {
      while (i < e.size() && IsBlank(e[i])) ++i;
      if (i >= e.size() || (e[i] != '+' && e[i] != '-')) return v;
      const char op = e[i++];
      const std::int64_t r = ArithProduct(e, i, line);
      v = op == '+' ? v + r : v - r;
    }
  }
  std::int64_t ArithProduct(const std::string& e, size_t& i, int line) {
    std::int64_t v = ArithAtom(e, i, line);
    for (;;) {
      while (i < e.size() && IsBlank(e[i])) ++i;
      if (i >= e.size() || (e[i] != '*' && e[i] != '/' && e[i] != '%')) return v;
      const char op = e[i++];
      const std::int64_t r = ArithAtom(e, i, line);
      if (op != '*' && r == 0) {
        Warn(line, "division by zero in $((...)); taken as 0");
        v = 0;
      } else {
        v = op == '*' ? v * r : op == '/' ? v / r : v % r;
      }
      if (v > (std::int64_t{1} << 40) || v < -(std::int64_t{1} << 40)) {
        Warn(line, "$((...)) beyond 2^40; taken as 0");
        v = 0;
      }
    }
  }
  std::int64_t ArithAtom(const std::string& e, size_t& i, int line) {
    while (i < e.size() && IsBlank(e[i])) ++i;
    if (i < e.size() && e[i] == '-') return -ArithAtom(e, ++i, line);
    if (i < e.size() && e[i] == '(') {
      const std::int64_t v = ArithSum(e, ++i, line);
      while (i < e.size() && IsBlank(e[i])) ++i;
      if (i < e.size() && e[i] == ')') ++i;
      return v;
    }
    size_t j = i;
    while (j < e.size() && IsNameChar(e[j])) ++j;
    const std::string tok = e.substr(i, j - i);
    i = j;
    if (tok.empty()) {
      arith_missing_operand_ = true;  // `$((2+))`: bash refuses it
      return 0;
    }
    if (std::optional<std::int64_t> n = ParseInt(tok)) return *n;
    const std::vector<std::string>* v = Lookup(tok);
    if (v == nullptr || v->empty()) {
      Warn(line, fmt::format("{} in $((...)) is not set in the script; taken as 0", tok));
      return 0;
    }
    std::optional<std::int64_t> n = ParseInt((*v)[0]);
    if (!n) Warn(line, fmt::format("{}='{}' in $((...)) is not a number; taken as 0", tok, Printable((*v)[0], 40)));
    return n.value_or(0);
  }

  // ---- words ----
  // The inside of "..." (pos_ past the opening quote) up to `until` ('"'; '\0' = end of text).
  void ReadQuotedBody(FieldBuilder& b, char until) {
    const int start = line_;
    while (pos_ < text_.size() && Peek() != until) {
      const char c = Peek();
      if (c == '\\' && std::string_view("$`\"\\\n").find(Peek(1)) != std::string_view::npos &&
          Peek(1) != '\0') {
        Advance();
        if (Peek() != '\n') b.Quoted(std::string(1, Peek()));
        Advance();
      } else if (c == '$') {
        QuotedExpansion(b);
      } else if (c == '`') {
        Balanced('`', '`');
        Warn(line_, "`...` not evaluated (memsim runs no command); taken as empty");
        b.Quoted("");  // "`cmd`" is one field, empty here, as "$(cmd)" is
      } else {
        b.Quoted(std::string(1, c));
        Advance();
      }
    }
    if (until != '\0') {
      if (pos_ >= text_.size()) Fail(start, "unterminated double quote");
      Advance();
    }
  }
  // "$X" keeps the value as one field; "${A[@]}" makes one field per element.
  void QuotedExpansion(FieldBuilder& b) {
    all_elements_ = Peek(1) == '@';
    std::vector<std::string> v = Dollar();
    const std::vector<CharLines> lines = std::move(last_lines_);
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
    while (pos_ < text_.size() && !EndsWord(Peek())) ReadWordPart(b);
    w.fields = b.Take();
    w.field_lines = b.TakeLines();
    if (!w.assign_name.empty()) {  // assignments do not split
      auto [joined, lines] = JoinFields(w.fields, w.field_lines);
      w.fields = {std::move(joined)};
      w.field_lines = {std::move(lines)};
    }
    return w;
  }
  void ReadAssignmentName(Word& w) {
    size_t j = pos_;
    while (j < text_.size() && IsNameChar(text_[j])) ++j;
    const bool append = j + 1 < text_.size() && text_[j] == '+' && text_[j + 1] == '=';
    if (j < text_.size() && (text_[j] == '=' || append)) {
      w.assign_name = std::string(text_.substr(pos_, j - pos_));
      w.append = append;
      pos_ = j + (append ? 2 : 1);
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
        b.Quoted(std::string(1, Peek()));
        Advance();
      }
    } else if (c == '\'') {
      const int start = line_;
      Advance();
      const size_t close = text_.find('\'', pos_);
      if (close == std::string_view::npos) Fail(start, "unterminated single quote");
      b.Quoted(text_.substr(pos_, close - pos_));
      while (pos_ <= close) Advance();
    } else if (c == '"') {
      Advance();
      ReadQuotedBody(b, '"');
    } else if (c == '$') {
      const std::vector<std::string> v = Dollar();
      const std::vector<CharLines> lines = std::move(last_lines_);
      for (size_t k = 0; k < v.size(); ++k) {
        if (k > 0) b.Close();  // array elements are separate fields
        b.Unquoted(v[k], k < lines.size() ? &lines[k] : nullptr);
      }
    } else if (c == '`') {
      Balanced('`', '`');
      Warn(line_, "`...` not evaluated (memsim runs no command); taken as empty");
    } else {
      b.Unquoted(std::string(1, c));
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
      while (pos_ < text_.size() && !EndsWord(Peek())) ReadWordPart(b);
      for (std::string& f : b.Take()) elems.push_back(std::move(f));
      for (CharLines& l : b.TakeLines()) elem_lines.push_back(std::move(l));
      if (pos_ < text_.size() && EndsWord(Peek()) && !IsBlank(Peek()) && Peek() != '\n' &&
          Peek() != ')') {
        Advance();  // stray operator inside an array: skipped
      }
    }
  }

  // ---- commands ----
  // Skips a redirection at pos_ ("> f", ">> f", "2>&1", "< f", "&> f").
  bool SkipRedirection() {
    size_t j = pos_;
    while (j < text_.size() && text_[j] >= '0' && text_[j] <= '9') ++j;
    if (j < text_.size() && text_[j] == '&' && j + 1 < text_.size() && text_[j + 1] == '>') ++j;
    if (j >= text_.size() || (text_[j] != '>' && text_[j] != '<')) return false;
    while (pos_ <= j) Advance();
    if (Peek() == '>') Advance();
    if (Peek() == '&') {
      Advance();
      while (IsNameChar(Peek()) || Peek() == '-') Advance();
      return true;
    }
    SkipBlanks();
    if (pos_ < text_.size() && !EndsWord(Peek())) ReadWord(false);
    return true;
  }

  // Reads one simple command (up to a newline, ';', '&', '|') and executes it.
  void ReadCommand() {
    std::vector<Word> words;
    bool function_def = false;
    for (;;) {
      SkipBlanks();
      if (pos_ >= text_.size()) break;
      const char c = Peek();
      if (c == '\n' || c == ';' || c == '&' || c == '|') {
        while (pos_ < text_.size() && (Peek() == c)) Advance();
        break;
      }
      if (SkipRedirection()) continue;
      if (c == '(' || c == ')') {
        if (c == '(' && Peek(1) == ')') function_def = true;
        Advance();
        continue;
      }
      const bool assign_ok = AllAssignments(words) || IsDeclaration(words);
      words.push_back(ReadWord(assign_ok));
    }
    if (function_def) {
      Enter(Frame::kSkipped, words.empty() ? line_ : words[0].line, "{", "function body");
      return;
    }
    if (!words.empty()) Execute(words);
  }
  static bool AllAssignments(const std::vector<Word>& w) {
    for (const Word& x : w) {
      if (x.assign_name.empty()) return false;
    }
    return true;
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

  enum class Frame { kIfFirst, kIfRest, kSkipped };
  struct Block {
    Frame frame;
    std::string opener;  // "if", "for", "while", "until", "case", "{"
  };
  bool Active() const {
    for (const Block& b : blocks_) {
      if (b.frame != Frame::kIfFirst) return false;
    }
    return true;
  }
  // Opens a block; `what` names it in the warning when it is reached in an active part.
  void Enter(Frame f, int line, const std::string& opener, const std::string& what) {
    if (Active()) {
      Warn(line, f == Frame::kIfFirst ? "'if' condition not evaluated; the first branch taken"
                                      : fmt::format("{} not evaluated; skipped", what));
    }
    blocks_.push_back({f, opener});
  }

  // Control words: returns true when `words` was one (handled here).
  bool Control(std::vector<Word>& words) {
    const std::string w0 = First(words[0]);
    const int line = words[0].line;
    if (w0 == "if") {
      Enter(Active() ? Frame::kIfFirst : Frame::kSkipped, line, "if", "if");
      return true;
    }
    if (w0 == "for" || w0 == "while" || w0 == "until" || w0 == "case" || w0 == "select") {
      Enter(Frame::kSkipped, line, w0, w0 == "case" ? "'case'" : fmt::format("'{}' loop", w0));
      return true;
    }
    if (w0 == "function") {
      Enter(Frame::kSkipped, line, "{", "function body");
      return true;
    }
    if ((w0 == "elif" || w0 == "else") && !blocks_.empty() && blocks_.back().opener == "if") {
      if (blocks_.back().frame == Frame::kIfFirst) blocks_.back().frame = Frame::kIfRest;
      words.erase(words.begin());
      if (w0 == "else" && !words.empty()) return Control(words);
      return true;
    }
    const bool closes_if = w0 == "fi" && !blocks_.empty() && blocks_.back().opener == "if";
    const bool closes_loop = (w0 == "done" || w0 == "esac") && !blocks_.empty() &&
                             blocks_.back().opener != "if" && blocks_.back().opener != "{";
    const bool closes_fn = w0 == "}" && !blocks_.empty() && blocks_.back().opener == "{";
    if (closes_if || closes_loop || closes_fn) {
      blocks_.pop_back();
      return true;
    }
    if (w0 == "then" || w0 == "do" || w0 == "{") {
      words.erase(words.begin());
      return words.empty() || Control(words);
    }
    return false;
  }

  void Assign(const Word& w) {
    std::vector<std::string>& v = vars_[w.assign_name];
    std::vector<CharLines>& lines = var_lines_[w.assign_name];
    if (!w.append) v.clear();
    if (lines.size() != v.size()) lines.assign(v.size(), CharLines());
    if (w.append && !w.is_array && !v.empty()) {
      v.back() += w.fields.empty() ? "" : w.fields[0];
      if (!w.field_lines.empty()) {
        lines.back().insert(lines.back().end(), w.field_lines[0].begin(), w.field_lines[0].end());
      }
    } else {
      v.insert(v.end(), w.fields.begin(), w.fields.end());
      for (size_t i = 0; i < w.fields.size(); ++i) {
        lines.push_back(i < w.field_lines.size() ? w.field_lines[i] : CharLines());
      }
    }
  }

  void Execute(std::vector<Word>& words) {
    if (Control(words) || words.empty() || !Active()) return;
    size_t i = 0;
    for (; i < words.size() && !words[i].assign_name.empty(); ++i) Assign(words[i]);
    if (i == words.size()) return;
    // Wrappers that run the rest as a command.
    while (i + 1 < words.size() && (First(words[i]) == "nohup" || First(words[i]) == "exec" ||
                                    First(words[i]) == "time" || First(words[i]) == "env")) {
      ++i;
    }
    const std::string cmd = First(words[i]);
    if (IsDeclaration(words)) {
      const bool exported = First(words[0]) == "export";
      for (size_t k = 1; k < words.size(); ++k) {
        if (!words[k].assign_name.empty()) Assign(words[k]);
        if (exported) Export(words[k]);
      }
      return;
    }
    if (cmd == "source" || cmd == "." || cmd == "eval") {
      Warn(words[i].line, fmt::format("'{}' not followed (memsim reads only this file)", cmd));
      return;
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
    if (MaybeTrainingCommand(fields)) {
      for (size_t k = 0; k < i; ++k) Export(words[k]);  // NAME=value torchrun ...
    }
  }

  // Records `export NAME=value` / `export NAME` (a variable set before) as the environment.
  void Export(const Word& w) {
    std::string name = w.assign_name;
    if (name.empty() && w.fields.size() == 1 && !w.fields[0].empty() && IsNameStart(w.fields[0][0])) {
      name = w.fields[0];
    }
    const auto it = vars_.find(name);
    if (name.empty() || it == vars_.end()) return;
    std::string value;
    for (const std::string& f : it->second) value += (value.empty() ? "" : " ") + f;
    out_.exports.push_back({name, value, w.line});
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
      Warn(f[0].second, fmt::format("a second training command; the first (line {}) is read",
                                    out_.launch_line));
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
        const std::vector<std::string>* v = Lookup(n);
        if (v == nullptr || v->empty()) continue;
        if (std::optional<std::int64_t> x = ParseInt((*v)[0]); x && *x >= 1 && *x <= 1 << 20) {
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
  std::map<std::string, std::vector<std::string>> vars_;
  std::map<std::string, std::vector<CharLines>> var_lines_;  // per element of vars_
  std::vector<CharLines> last_lines_;  // of the elements the last Dollar() returned, or empty
  std::vector<Block> blocks_;
  bool found_ = false;
  bool all_elements_ = false;
  bool arith_missing_operand_ = false;  // set by ArithAtom, read by Arithmetic  // the last expansion was "${A[@]}" or "$@": one field each
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

MegatronLaunch ReadLaunchScript(const std::string& label, std::string_view text) {
  // CRLF line ends (a script saved on Windows): bash keeps each '\r' as part of the line, so
  // `\` before CR-LF continues nothing and the training command stops at its first line (the
  // model's flags silently lost). The script is read as with LF line ends, and told.
  const size_t crlf = text.find("\r\n");
  if (crlf == std::string_view::npos) return ScriptReader(label, text).Read();
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) lf += text[i];
  }
  MegatronLaunch out = ScriptReader(label, lf).Read();
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(crlf), '\n');
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
  return std::any_of(words.begin(), words.end(),
                     [](const std::string& w) { return !w.starts_with("-") && w.ends_with(".py"); });
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
    if (w.starts_with(one_line)) w = std::string(kCommandLineLabel) + ": " + w.substr(one_line.size());
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
        if (!n) throw InputError(fmt::format("{} {}", kCommandLineLabel, WorldCountError(name, value, false)));
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
      throw InputError(fmt::format("--megatron-args: '{}' before the first flag", Printable(w, 40)));
    } else {
      out.arguments.back().values.push_back(w);
    }
  }
  return out;
}

// A launch script is kilobytes; an arguments log may be a whole training log. memsim's bound,
// 256 MiB (an estimate), stops a read of an endless file such as /dev/zero.
constexpr std::int64_t kMaxLaunchFileBytes = std::int64_t{1} << 28;

MegatronLaunch ReadMegatronArgsFile(const std::string& path) {
  const std::optional<std::string> read =
      ReadBoundedFile(path, Printable(path), kMaxLaunchFileBytes, "a --megatron-args file");
  if (!read) {
    throw InputError(fmt::format("{}: cannot read the file: {}", Printable(path), WhyUnreadable(path)));
  }
  const std::string& text = *read;
  if (LooksLikeArgumentsLog(text)) return ReadArgumentsLog(Printable(path), text);
  return ReadLaunchScript(Printable(path), text);
}

}  // namespace memsim::config
