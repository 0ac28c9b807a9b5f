#include "config/reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/json_pointer.h"

namespace memsim::config::internal {

std::string Source::At(const std::string& pointer) const {
  // A value set by --set, or a part of one ("/training/recompute_modules/0" inside
  // "--set training.recompute_modules=[...]"): the --set text names it, with the part's pointer.
  for (std::string prefix = pointer; !prefix.empty();) {
    auto it = set_labels.find(prefix);
    if (it != set_labels.end()) {
      if (prefix == pointer) return it->second;
      return fmt::format("{}: {}", it->second, pointer.substr(prefix.size()));
    }
    const size_t slash = prefix.rfind('/');
    prefix.resize(slash == std::string::npos ? 0 : slash);
  }
  return fmt::format("{}: {}", file, pointer.empty() ? "/" : pointer);
}

void Fail(const std::string& location, const std::string& what) {
  throw InputError(fmt::format("{}: {}", location, what));
}

std::string Describe(const Json& v) {
  return Printable(v.dump(-1, ' ', false, Json::error_handler_t::replace), 60);
}

namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 when the byte there does not start
// one (RFC 3629 section 4: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string Printable(std::string_view text, size_t max_chars) {
  std::string out;
  size_t chars = 0;
  size_t cut = std::string::npos;  // size of `out` after max_chars - 3 code points
  for (size_t i = 0; i < text.size();) {
    if (chars == max_chars - 3) cut = out.size();
    if (chars == max_chars) {
      out.resize(cut);
      return out + "...";
    }
    const size_t n = Utf8Length(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
    ++chars;
  }
  return out;
}

std::optional<size_t> FindTooDeep(std::string_view text) {
  return FindJsonTooDeep(text, kMaxJsonDepth);
}

std::string Child(const std::string& pointer, std::string_view key) {
  return ChildPointer(pointer, key);
}

namespace {

// Thrown by the parser callback when the nesting limit is passed; ParseJson turns it into an
// InputError with the line and column.
struct TooDeep {};

// Rejects duplicate keys, which nlohmann would silently resolve to the last one, and nesting
// deeper than kMaxJsonDepth. Each open object or array keeps only its own reference token (the
// key or index it sits at in its parent), so the bookkeeping is linear in the document; the full
// JSON pointer is assembled only for a message.
class DuplicateKeyCheck {
 public:
  // `where` receives, before each value is parsed, the JSON pointer it will have (the parser
  // copies the callback, so the caller reads it through the pointer after an exception).
  DuplicateKeyCheck(const std::string& file, std::string* where) : file_(file), where_(where) {}

  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // `depth` counts the containers already open: 0 for the outermost one.
        if (depth >= kMaxJsonDepth) throw TooDeep{};
        frames_.push_back({event == Json::parse_event_t::object_start, ChildToken(), {}, "", 0});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        CountElement();
        break;
      case Json::parse_event_t::key: {
        Frame& top = frames_.back();
        const std::string key = parsed.get<std::string>();
        if (!top.keys.insert(key).second) {
          throw InputError(fmt::format("{}: {}: duplicate key", file_, Child(Pointer(), key)));
        }
        top.pending_key = key;
        *where_ = Child(Pointer(), key);
        break;
      }
      case Json::parse_event_t::value:
        CountElement();
        break;
    }
    if (!frames_.empty() && !frames_.back().is_object) {
      *where_ = Child(Pointer(), std::to_string(frames_.back().count));
    }
    return true;
  }

 private:
  struct Frame {
    bool is_object;
    std::string token;  // "/<escaped key or index>" in the parent; "" for the outermost
    std::set<std::string> keys;
    std::string pending_key;
    size_t count;
  };
  // The reference token of a container opening now, inside the current top frame.
  std::string ChildToken() const {
    if (frames_.empty()) return "";
    const Frame& top = frames_.back();
    return Child("", top.is_object ? top.pending_key : std::to_string(top.count));
  }
  // The JSON pointer of the innermost open container.
  std::string Pointer() const {
    std::string out;
    for (const Frame& f : frames_) out += f.token;
    return out;
  }
  void CountElement() {
    if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().count;
  }
  const std::string& file_;
  std::string* where_;
  std::vector<Frame> frames_;
};

// 1-based line and column of byte `offset` of `text`.
std::pair<int, int> LineColumn(const std::string& text, size_t offset) {
  int line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

Json ParseJson(const std::string& text, const std::string& file) {
  std::string where;
  try {
    return Json::parse(text, DuplicateKeyCheck(file, &where));
  } catch (const TooDeep&) {
    // The parser accepted everything before the container that passed the limit, so the
    // string-aware scan finds the same '[' or '{'.
    const std::optional<size_t> at = FindTooDeep(text);
    const auto [line, column] = LineColumn(text, at.value_or(0));
    throw InputError(fmt::format("{}:{}:{}: JSON nested deeper than memsim's limit of {} levels",
                                 file, line, column, kMaxJsonDepth));
  } catch (const Json::parse_error& e) {
    // Line and column of the byte where parsing stopped (e.byte is 1-based).
    size_t stop = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    const auto [line, column] = LineColumn(text, stop);
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line L, column C:
    // syntax error while parsing value - <reason>"; keep what follows the location.
    std::string reason = e.what();
    size_t col = reason.find("column ");
    size_t colon = col == std::string::npos ? std::string::npos : reason.find(": ", col);
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    const std::string prefix = "syntax error ";
    if (reason.rfind(prefix, 0) == 0) reason = reason.substr(prefix.size());
    throw InputError(fmt::format("{}:{}:{}: malformed JSON: {}", file, line, column, reason));
  } catch (const Json::out_of_range&) {
    // nlohmann's number overflow (406): a literal beyond a double's range, such as 1e400.
    throw InputError(fmt::format(
        "{}: {}: out of range for a number: beyond the largest 64-bit float, about "
        "1.8e308 (IEEE 754 binary64)",
        file, where.empty() ? "/" : where));
  }
}

ObjectReader::ObjectReader(const Source& source, const Json& object, std::string pointer)
    : source_(source), object_(object), pointer_(std::move(pointer)) {
  if (!object_.is_object()) {
    Fail(source_.At(pointer_), fmt::format("expected an object, got {}", Describe(object_)));
  }
}

bool ObjectReader::Has(std::string_view key) const {
  auto it = object_.find(std::string(key));
  return it != object_.end() && !it->is_null();
}

bool ObjectReader::IsNull(std::string_view key) const {
  auto it = object_.find(std::string(key));
  return it != object_.end() && it->is_null();
}

const Json* ObjectReader::Get(std::string_view key) { return Value(key); }

void ObjectReader::FieldError(std::string_view key, const std::string& what) const {
  const KeyError error{At(key), fmt::format("{}: {}", At(key), what)};
  if (source_.field_errors == nullptr) throw InputError(error.message);
  // A key read twice (a check that reads it again) is one error.
  std::vector<KeyError>& errors = *source_.field_errors;
  if (std::find(errors.begin(), errors.end(), error) == errors.end()) errors.push_back(error);
}

void ObjectReader::WarnNotModelled(std::string_view key, std::string message,
                                   NotModelled::Direction direction,
                                   std::vector<std::string>* warnings) const {
  warnings->push_back(std::move(message));
  if (source_.not_modelled == nullptr) return;
  auto it = object_.find(std::string(key));
  std::vector<std::string> values;
  if (it != object_.end()) values.push_back(Describe(*it));
  source_.not_modelled->push_back({At(key), PointerOf(key), std::move(values), direction, true});
}

const Json* ObjectReader::Value(std::string_view key) {
  read_.insert(std::string(key));
  auto it = object_.find(std::string(key));
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {

bool FitsInt(const Json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>() <= std::numeric_limits<int>::max();
  if (v.is_number_integer()) {
    const auto x = v.get<std::int64_t>();
    return x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max();
  }
  return false;
}

// memsim's limits on sizes, far above any real model, so that the byte products computed
// downstream (tokens × width × vocabulary × bytes) stay well inside int64.
struct Limit {
  std::string_view key;
  int max;
};
constexpr Limit kLimits[] = {
    {"hidden_size", 1 << 20},      {"n_embd", 1 << 20},
    {"intermediate_size", 1 << 22}, {"n_inner", 1 << 22},
    {"ffn_hidden_size", 1 << 22},   {"num_attention_heads", 1 << 16},
    {"n_head", 1 << 16},            {"num_key_value_heads", 1 << 16},
    {"num_query_groups", 1 << 16},  {"head_dim", 1 << 16},
    {"kv_channels", 1 << 16},       {"num_hidden_layers", 1 << 16},
    {"n_layer", 1 << 16},           {"num_layers", 1 << 16},
    {"vocab_size", 1 << 26},        {"seq_length", 1 << 26},
    {"micro_batch_size", 1 << 16},  {"global_batch_size", 1 << 30},
    {"tensor_model_parallel_size", 1 << 16}, {"pipeline_model_parallel_size", 1 << 16},
    {"data_parallel_size", 1 << 20}, {"context_parallel_size", 1 << 16},
    {"make_vocab_size_divisible_by", 1 << 20},
    // hf-trainer's names of seq_length and data_parallel_size (hf_trainer.h), bounded alike.
    {"max_seq_length", 1 << 26},    {"world_size", 1 << 20},
    {"per_device_train_batch_size", 1 << 16}, {"per_device_eval_batch_size", 1 << 16},
    // train_iters has no limit of its own: a long run simulates until its steady state
    // (config/iterations.h); rules.cc bounds the simulated layer passes.
};

}  // namespace

std::optional<int> ObjectReader::PositiveInt(std::string_view key) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer() && !FitsInt(*v) &&
      (v->is_number_unsigned() || v->get<std::int64_t>() > 0)) {
    // A positive integer all the same: say which bound it passed, not "expected a positive
    // integer, got 1099511627776".
    const auto limit = std::find_if(std::begin(kLimits), std::end(kLimits),
                                    [&](const Limit& l) { return l.key == key; });
    FieldError(key, fmt::format(
                        "{} exceeds memsim's limit of {}", Describe(*v),
                        limit != std::end(kLimits) ? limit->max : std::numeric_limits<int>::max()));
    return std::nullopt;
  }
  if (!FitsInt(*v) || v->get<std::int64_t>() <= 0) {
    FieldError(key, fmt::format("expected a positive integer, got {}", Describe(*v)));
    return std::nullopt;
  }
  for (const Limit& l : kLimits) {
    if (l.key == key && v->get<std::int64_t>() > l.max) {
      FieldError(key, fmt::format("{} exceeds memsim's limit of {}", Describe(*v), l.max));
      return std::nullopt;
    }
  }
  return v->get<int>();
}

std::optional<int> ObjectReader::NonNegativeInt(std::string_view key) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer() && !FitsInt(*v) &&
      (v->is_number_unsigned() || v->get<std::int64_t>() > 0)) {
    FieldError(key, fmt::format("{} exceeds memsim's limit of {}", Describe(*v),
                                std::numeric_limits<int>::max()));
    return std::nullopt;
  }
  if (!FitsInt(*v) || v->get<std::int64_t>() < 0) {
    FieldError(key, fmt::format("expected a non-negative integer, got {}", Describe(*v)));
    return std::nullopt;
  }
  return v->get<int>();
}

std::optional<int> ObjectReader::IntInRange(std::string_view key, int lo, int hi) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (!FitsInt(*v) || v->get<std::int64_t>() < lo || v->get<std::int64_t>() > hi) {
    FieldError(key, fmt::format("expected an integer from {} to {}, got {}", lo, hi, Describe(*v)));
    return std::nullopt;
  }
  return v->get<int>();
}

std::optional<std::int64_t> ObjectReader::NonNegativeInt64(std::string_view key) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  const bool ok = (v->is_number_unsigned() &&
                   v->get<std::uint64_t>() <=
                       static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) ||
                  (v->is_number_integer() && v->get<std::int64_t>() >= 0);
  if (!ok) {
    FieldError(key, fmt::format("expected a non-negative integer, got {}", Describe(*v)));
    return std::nullopt;
  }
  return v->get<std::int64_t>();
}

std::optional<bool> ObjectReader::Bool(std::string_view key) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    FieldError(key, fmt::format("expected true or false, got {}", Describe(*v)));
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<std::string> ObjectReader::String(std::string_view key) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    FieldError(key, fmt::format("expected a string, got {}", Describe(*v)));
    return std::nullopt;
  }
  return v->get<std::string>();
}

std::optional<double> ObjectReader::Number(std::string_view key, double lo, double hi, bool lo_open,
                                           bool hi_open) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  const bool is_number = v->is_number();
  const double x = is_number ? v->get<double>() : 0.0;
  const bool ok =
      is_number && std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (!ok) {
    FieldError(key, fmt::format("expected a number in {}{}, {}{}, got {}", lo_open ? "(" : "[", lo,
                                hi, hi_open ? ")" : "]", Describe(*v)));
    return std::nullopt;
  }
  return x;
}

namespace {

// The choice a dtype spelled as PyTorch names it stands for ("bfloat16", "torch.float16",
// "half": torch.bfloat16, torch.float16 = torch.half, torch.float32 = torch.float), when that
// choice is among `choices`; "" otherwise. Edit distance misses these ("bfloat16" is 4 edits
// from "bf16").
std::string DtypeAlias(std::string_view value, const std::vector<std::string>& choices) {
  if (value.starts_with("torch.")) value.remove_prefix(6);
  static constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
      {"bfloat16", "bf16"}, {"float16", "fp16"}, {"half", "fp16"},
      {"float32", "fp32"},  {"float", "fp32"},   {"float8", "fp8"}};
  for (const auto& [alias, choice] : kAliases) {
    if (value == alias && std::find(choices.begin(), choices.end(), choice) != choices.end()) {
      return std::string(choice);
    }
  }
  return "";
}

}  // namespace

std::optional<std::string> ObjectReader::Choice(std::string_view key,
                                                const std::vector<std::string>& choices) {
  const Json* v = Value(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    for (const std::string& c : choices) {
      if (c == s) return s;
    }
  }
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "'" : ", '") + c + "'";
  std::string message = fmt::format("expected one of {}, got {}", list, Describe(*v));
  if (v->is_string()) {
    std::string guess = DtypeAlias(v->get<std::string>(), choices);
    if (guess.empty()) guess = ClosestMatch(v->get<std::string>(), choices);
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
  }
  FieldError(key, message);
  return std::nullopt;
}

std::vector<std::string> ObjectReader::Unread() const {
  std::vector<std::string> out;
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (!it.key().empty() && it.key()[0] == '_') continue;
    if (read_.count(it.key()) == 0) out.push_back(it.key());
  }
  return out;
}

std::string ObjectReader::NearMiss(std::string_view key, const std::vector<std::string>& more) const {
  std::vector<std::string> absent;
  for (const std::string& k : read_) {
    if (!object_.contains(k)) absent.push_back(k);
  }
  for (const std::string& k : more) {
    if (!object_.contains(k)) absent.push_back(k);
  }
  return ClosestMatch(key, absent);
}

void ObjectReader::RejectUnknown(const std::vector<std::string>& known) const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    const std::string& key = it.key();
    if ((!key.empty() && key[0] == '_') ||
        std::find(known.begin(), known.end(), key) != known.end()) {
      continue;
    }
    std::string message = "unknown key";
    const std::string guess = ClosestMatch(key, known);
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    FieldError(key, message);
  }
}

}  // namespace memsim::config::internal
