// Internal to config/: typed, located reads of a parsed JSON document. Every failed read throws
// InputError with "<location>: <what was expected>, got <value>", where the location is
// "<file>: <JSON pointer>" (RFC 6901), or "--set KEY=VALUE" for a value that came from the
// command line -- or, for a document whose Source has field_errors, records that message there
// and reads the key as absent. Includes nlohmann/json: include only from config/*.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/setup.h"

namespace memsim::config::internal {

using Json = nlohmann::json;

// One error of one key: "<location>: <what>", and the location alone.
struct KeyError {
  std::string location;
  std::string message;
  bool operator==(const KeyError&) const = default;
};

// A document as shown in messages: its file label and the values overridden on the command line.
struct Source {
  std::string file;  // e.g. "configs/x.json", "<embedded>/configs/default.json"
  std::map<std::string, std::string> set_labels;  // JSON pointer -> "--set KEY=VALUE"
  // Where an ObjectReader of this document puts the messages of its field errors (a value of
  // the wrong type or out of range, an unknown key) instead of throwing them, so that one run
  // reports them all (LoadParsedConfig, load_internal.h); nullptr = throw the first. Not owned.
  std::vector<KeyError>* field_errors = nullptr;
  // Where an ObjectReader of this document records the keys it warns are not modelled
  // (ObjectReader::WarnNotModelled), for the out-of-memory verdict's caveat (setup.h
  // Setup::not_modelled); nullptr = the warning only. Not owned.
  std::vector<NotModelled>* not_modelled = nullptr;

  // "<file>: <pointer>", or the --set label when the value at `pointer` came from --set.
  std::string At(const std::string& pointer) const;
};

[[noreturn]] void Fail(const std::string& location, const std::string& what);

// `v` as compact JSON for "got ..." (strings quoted), shortened to 60 characters; invalid UTF-8
// in strings shows as U+FFFD (never a library exception).
std::string Describe(const Json& v);

// `text` safe to echo in a message: each byte that is not part of valid UTF-8 becomes U+FFFD,
// and text of more than `max_chars` code points is cut to max_chars - 3 of them plus "...".
std::string Printable(std::string_view text, size_t max_chars = 80);

// memsim's limit on JSON nesting (objects and arrays, the outermost one is level 1). Real
// configs nest 3 levels; the limit keeps a hostile file from costing memory or stack.
constexpr int kMaxJsonDepth = 64;

// The byte offset of the '[' or '{' that opens level kMaxJsonDepth + 1 of `text` (strings
// skipped), or std::nullopt when the text nests no deeper than the limit. Linear, no allocation.
std::optional<size_t> FindTooDeep(std::string_view text);

// Appends one escaped reference token to a JSON pointer.
std::string Child(const std::string& pointer, std::string_view key);

// Parses `text`; a syntax error throws "<file>:<line>:<column>: malformed JSON: <reason>", a
// duplicate key "<file>: <pointer>: duplicate key", nesting deeper than kMaxJsonDepth
// "<file>:<line>:<column>: JSON nested deeper than memsim's limit of 64 levels" (found by the
// parser callback, so the document is never built).
Json ParseJson(const std::string& text, const std::string& file);

// Reads the members of one JSON object and remembers which keys were read, so that the rest
// can be rejected (training config) or listed as ignored (model file). Keys whose name starts
// with '_' are comments ("_source") and never count as unknown. A member whose value is null
// reads as absent ("null means the default").
class ObjectReader {
 public:
  // Fails with "expected an object, got ..." unless `object` is an object.
  ObjectReader(const Source& source, const Json& object, std::string pointer);

  const std::string& pointer() const { return pointer_; }
  std::string PointerOf(std::string_view key) const { return Child(pointer_, key); }
  std::string At(std::string_view key) const { return source_.At(PointerOf(key)); }
  const Source& source() const { return source_; }

  // True iff `key` is present with a non-null value. Does not mark it read.
  bool Has(std::string_view key) const;
  // Whether `key` is present with the value null (Hugging Face writes None as null).
  bool IsNull(std::string_view key) const;
  // The value, or nullptr when absent or null. Marks the key read.
  const Json* Get(std::string_view key);

  // A positive int; size keys (hidden_size, seq_length, ...) also at most memsim's limit for
  // them (reader.cc kLimits): "<v> exceeds memsim's limit of <max>".
  std::optional<int> PositiveInt(std::string_view key);
  std::optional<int> NonNegativeInt(std::string_view key);
  // Integer in [lo, hi]: "expected an integer from lo to hi, got ...".
  std::optional<int> IntInRange(std::string_view key, int lo, int hi);
  std::optional<std::int64_t> NonNegativeInt64(std::string_view key);
  std::optional<bool> Bool(std::string_view key);
  std::optional<std::string> String(std::string_view key);
  // A number in [lo, hi] (bounds exclusive when the flag says so), described as in
  // "expected a number in (0, 1), got 2".
  std::optional<double> Number(std::string_view key, double lo, double hi, bool lo_open,
                               bool hi_open);
  // One of `choices`; else "expected one of 'a', 'b', got "c" (did you mean 'a'?)".
  std::optional<std::string> Choice(std::string_view key, const std::vector<std::string>& choices);

  // Keys present (null or not) that were never read, in the document's (sorted) order, without
  // '_' comment keys.
  std::vector<std::string> Unread() const;
  // Fails on the first key (in sorted order) not in `known` and not a '_' comment:
  // "unknown key (did you mean 'x'?)" with the closest of `known`. With Source::field_errors,
  // every such key is recorded there instead.
  void RejectUnknown(const std::vector<std::string>& known) const;
  // For a key memsim does not read: the closest (ClosestMatch) of the keys it asked this object
  // for (read or skipped) and of `more`, not counting those the object holds; "" when none is
  // close. "intermediate_sise" -> "intermediate_size".
  std::string NearMiss(std::string_view key, const std::vector<std::string>& more = {}) const;
  // Marks `key` read without interpreting it.
  void Skip(std::string_view key) { read_.insert(std::string(key)); }
  // A field error of `key` ("<file>: <pointer>: <what>"): recorded in Source::field_errors (the
  // typed reads above then return std::nullopt, as for an absent key), or thrown as InputError
  // when there is none. For a reader's own checks of one value (hf_deepspeed.cc bucket sizes).
  void FieldError(std::string_view key, const std::string& what) const;
  // A key whose effect on memory memsim does not model: `message` (which starts with At(key))
  // goes to `warnings`, and the key, its value and which way memsim errs without it
  // (`direction`: memsim predicts more, less, or either) to Source::not_modelled when the
  // document has one.
  void WarnNotModelled(std::string_view key, std::string message,
                       NotModelled::Direction direction, std::vector<std::string>* warnings) const;

 private:
  const Json* Value(std::string_view key);  // non-null value, marked read
  const Source& source_;
  const Json& object_;
  std::string pointer_;
  std::set<std::string> read_;
};

}  // namespace memsim::config::internal
