// The documents of a Setup and how references between them resolve (documents.h), and the
// embedded set's lookups (embedded.h).
#include "config/documents.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "config/embedded.h"
#include "config/stack.h"
#include "config/parts.h"
#include "core/error.h"
#include "core/read_file.h"

namespace memsim::config {
namespace {

namespace fs = std::filesystem;

std::string Normal(const fs::path& p) { return p.lexically_normal().generic_string(); }

// The names of the embedded files under `dir` ending ".json", without the directory and suffix.
std::vector<std::string> EmbeddedNames(std::string_view dir) {
  std::vector<std::string> out;
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (f.path.starts_with(dir) && f.path.ends_with(".json")) {
      out.emplace_back(f.path.substr(dir.size(), f.path.size() - dir.size() - 5));
    }
  }
  return out;
}

}  // namespace

const std::string_view* FindEmbedded(std::string_view path) {
  const std::string normal = Normal(fs::path(std::string(path)));
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (f.path == normal) return &f.text;
  }
  return nullptr;
}

std::vector<std::string> EmbeddedDeviceNames() {
  std::vector<std::string> out = EmbeddedNames("configs/devices/");
  std::sort(out.begin(), out.end());
  return out;
}

namespace internal {
namespace {

// memsim's bound on one JSON document (config, model file, device preset, TrainingArguments or
// adapter JSON): 64 MiB, an estimate far above any of them (kilobytes). It stops a read of an
// endless file such as /dev/zero instead of hanging until memory runs out.
constexpr std::int64_t kMaxDocumentBytes = std::int64_t{1} << 26;

bool ReadFile(const std::string& path, std::string* text) {
  std::optional<std::string> read =
      ReadBoundedFile(path, Printable(path), kMaxDocumentBytes, "a JSON file");
  if (!read) return false;
  *text = std::move(*read);
  return true;
}

std::optional<Document> FindEmbeddedDocument(const std::string& relative) {
  const std::string normal = Normal(fs::path(relative));
  const std::string_view* text = FindEmbedded(normal);
  if (text == nullptr) return std::nullopt;
  return Document{std::string(kEmbeddedPrefix) + normal, std::string(*text), true, normal};
}

// Resolves `ref` (a path as written in `from`) relative to the document `from`.
// Returns the label used in messages and, when found, the document.
std::optional<Document> Resolve(const Document& from, const std::string& ref, std::string* label) {
  if (from.embedded) {
    const fs::path rel = fs::path(from.embedded_path).parent_path() / ref;
    *label = std::string(kEmbeddedPrefix) + Normal(rel);
    return FindEmbeddedDocument(Normal(rel));
  }
  fs::path p(ref);
  if (p.is_relative()) p = fs::path(from.label).parent_path() / p;
  *label = Normal(p);
  Document d{*label, "", false, ""};
  if (!ReadFile(*label, &d.text)) return std::nullopt;
  return d;
}

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.ends_with(".json"));
}

// The file at path `ref`: relative to the document `from` (which may itself be embedded), or to
// the working directory when `from` is null. Sets *label to the name used in messages.
std::optional<Document> ReadByPath(const std::string& ref, const Document* from, std::string* label) {
  if (from != nullptr) return Resolve(*from, ref, label);
  *label = Normal(fs::path(ref));
  Document d{*label, "", false, ""};
  if (!ReadFile(*label, &d.text)) return std::nullopt;
  return d;
}


std::string CommaList(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

Document FindReferencedDocument(const std::string& ref, const std::string& location,
                                const Document& from, const std::string& what,
                                const std::string& file_in_directory) {
  std::string label;
  std::optional<Document> d = ReadByPath(ref, &from, &label);
  if (d) return *d;
  std::error_code ec;
  if (!file_in_directory.empty() && !from.embedded && fs::is_directory(label, ec)) {
    std::string inner;
    d = ReadByPath((fs::path(ref) / file_in_directory).string(), &from, &inner);
    if (d) return *d;
    throw InputError(fmt::format("{}: cannot read {}: '{}' is a directory and its {} cannot be "
                                 "read: {}",
                                 location, what, Printable(label), file_in_directory,
                                 WhyUnreadable(inner)));
  }
  throw InputError(fmt::format("{}: cannot read {} '{}': {}", location, what, Printable(label),
                               WhyUnreadable(label)));
}

Document ReadConfigDocument(const std::string& config_path, bool use_embedded_default) {
  if (config_path.empty()) {
    if (!use_embedded_default) throw InputError("no config file given");
    std::optional<Document> d = FindEmbeddedDocument("configs/default.json");
    if (!d) throw InputError("this build has no embedded default config");
    return *d;
  }
  Document config{config_path, "", false, ""};
  if (!ReadFile(config_path, &config.text)) {
    std::error_code ec;
    if (config_path.find('=') != std::string::npos && !fs::exists(config_path, ec)) {
      // `--set a=1 b=2`: the second pair lands where the config is expected.
      throw InputError(
          fmt::format("unexpected argument '{}' (--set takes one KEY=VALUE and is "
                      "repeated for more: --set a=1 --set b=2)",
                      Printable(config_path)));
    }
    throw InputError(fmt::format("{}: cannot read the config file: {}", config_path,
                                 WhyUnreadable(config_path)));
  }
  return config;
}

std::string KnownDevices() { return CommaList(EmbeddedDeviceNames()); }

Document FindDeviceDocument(const std::string& ref, const std::string& location, const Document* from) {
  if (ref.empty()) Fail(location, "expected a device preset name or a path to a preset file");
  if (LooksLikePath(ref)) {
    std::string label;
    const std::optional<Document> doc = ReadByPath(ref, from, &label);
    if (!doc) {
      Fail(location, fmt::format("cannot read device preset file '{}': {}", Printable(label),
                                 WhyUnreadable(label)));
    }
    return *doc;
  }
  std::optional<Document> doc = FindEmbeddedDocument("configs/devices/" + ref + ".json");
  if (!doc) {
    std::string message = fmt::format("unknown device preset '{}'", Printable(ref));
    const std::string guess = ClosestMatch(ref, EmbeddedDeviceNames());
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    message += fmt::format("; known presets: {}; or give a path to a preset file", KnownDevices());
    Fail(location, message);
  }
  return *doc;
}

Document FindModelDocument(const std::string& ref, const std::string& location, const Document* from) {
  if (ref.empty()) Fail(location, "expected a path to a model file or a shipped model name");
  // A Hugging Face model directory: its config.json. A directory wins over a shipped model of
  // the same spelling (what is on disk is what the user points at).
  if (from == nullptr || !from->embedded) {
    fs::path dir(ref);
    if (from != nullptr && dir.is_relative()) dir = fs::path(from->label).parent_path() / dir;
    std::error_code ec;
    if (fs::is_directory(dir, ec)) {
      const std::string file = Normal(dir / "config.json");
      Document d{file, "", false, ""};
      if (!ReadFile(file, &d.text)) {
        Fail(location,
             fmt::format("directory '{}' has no readable config.json", Printable(Normal(dir))));
      }
      return d;
    }
  }
  if (!LooksLikePath(ref)) {
    std::optional<Document> doc = FindEmbeddedDocument("models/" + ref + ".json");
    if (doc) return *doc;
    const std::vector<std::string> models = EmbeddedNames("models/");
    std::string message = fmt::format("unknown model '{}'", Printable(ref));
    const std::string guess = ClosestMatch(ref, models);
    if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
    message += fmt::format("; shipped models: {}; or give a path to a model file", CommaList(models));
    Fail(location, message);
  }
  std::string label;
  const std::optional<Document> doc = ReadByPath(ref, from, &label);
  if (!doc) {
    // A shipped config copied elsewhere keeps its "../models/NAME.json": name the shipped model.
    const std::string stem = fs::path(ref).stem().string();
    const bool shipped = FindEmbeddedDocument("models/" + stem + ".json").has_value();
    const bool relative = from != nullptr && fs::path(ref).is_relative();
    Fail(location,
         fmt::format("cannot read model file '{}'{}{}", Printable(label),
                     relative ? " (a relative path is read from the config's folder)" : "",
                     shipped ? fmt::format("; the shipped model of that name is \"{}\"", stem) : ""));
  }
  return *doc;
}

void ApplyOverride(const std::string& text, Json* root, Source* source) {
  const size_t eq = text.find('=');
  // Echoed safely: invalid UTF-8 replaced, long keys and values shortened.
  const std::string label =
      "--set " + (eq == std::string::npos
                      ? Printable(text)
                      : Printable(std::string_view(text).substr(0, eq)) + "=" +
                            Printable(std::string_view(text).substr(eq + 1)));
  if (eq == std::string::npos || eq == 0) {
    throw InputError(fmt::format("{}: expected KEY=VALUE, e.g. training.micro_batch_size=2", label));
  }
  const std::string key = text.substr(0, eq);
  const std::string raw = text.substr(eq + 1);
  const size_t dot = key.find('.');
  const std::string section = dot == std::string::npos ? key : key.substr(0, dot);
  // model.<key> edits an inline model (as --megatron-args builds one from the arguments).
  const bool inline_model =
      section == "model" && root->contains("model") && (*root)["model"].is_object();
  if (dot == std::string::npos ||
      (section != "training" && section != "allocator" && !inline_model) ||
      dot + 1 == key.size()) {
    // model.<key> on a model file: the training block's architecture keys override it (not
    // under hf-trainer, which takes the model file as it is).
    std::string hint;
    const bool hf_trainer = TrainingArgumentsKeys(*root);
    if (section == "model" && dot != std::string::npos && dot + 1 < key.size()) {
      const std::vector<std::string>& arch = MegatronArchitectureKeys();
      const std::string name = key.substr(dot + 1);
      hint = hf_trainer ? " (a model file is not edited by --set; give --model FILE with an "
                          "edited copy)"
             : std::find(arch.begin(), arch.end(), name) != arch.end()
                 ? fmt::format(" (a model file is not edited by --set; write training.{}, which "
                               "overrides it)",
                               name)
                 : " (a model file is not edited by --set; the training block's architecture "
                   "keys override it, in Megatron's names: num_layers, hidden_size, "
                   "ffn_hidden_size, num_attention_heads, num_query_groups, vocab_size, ...)";
    } else if (dot != std::string::npos && dot > 0 && dot + 1 < key.size()) {
      // A misspelt section ("trainig.seq_length").
      const std::string guess = ClosestMatch(section, {"training", "allocator"});
      if (!guess.empty()) {
        hint = fmt::format(" (did you mean '{}.{}'?)", guess, Printable(key.substr(dot + 1)));
      }
    }
    throw InputError(
        fmt::format("{}: expected a key training.<name> or allocator.<name>{}", label, hint));
  }
  const std::string name = key.substr(dot + 1);
  if (const size_t inner = name.find('.'); inner != std::string::npos) {
    // No key of a block holds a '.': this names a member of a nested object, which --set does
    // not edit (it would add an unknown key "a.b" to the block).
    throw InputError(fmt::format("{}: {} is a key inside {}.{}; --set replaces a key of the {} "
                                 "block as a whole: give its whole value, e.g. --set "
                                 "'{}.{}={{...}}'",
                                 label, Printable(name.substr(inner + 1)), section,
                                 Printable(name.substr(0, inner)), section, section,
                                 Printable(name.substr(0, inner))));
  }
  Json value;
  if (raw == "True" || raw == "False") {
    value = raw == "True";
  } else if (FindTooDeep(raw)) {
    throw InputError(fmt::format("{}: value nested deeper than memsim's limit of {} levels", label,
                                 kMaxJsonDepth));
  } else {
    try {
      value = Json::parse(raw);
    } catch (const Json::exception&) {
      value = raw;  // a bare word: a string
    }
  }
  Json& sec = (*root)[section];
  if (sec.is_null()) sec = Json::object();
  if (!sec.is_object()) {
    throw InputError(fmt::format("{}: {}: /{} is not an object", label, source->file, section));
  }
  sec[name] = value;
  source->set_labels[Child("/" + section, name)] = label;
}

bool TrainingArgumentsKeys(const Json& root) {
  const auto training = root.find("training");
  if (training == root.end() || !training->is_object()) return false;
  const auto name = training->find("framework");
  if (name == training->end() || !name->is_string()) return false;
  const Stack* stack = FindStack(name->get<std::string>());
  return stack != nullptr && stack->Traits().training_arguments_keys;
}

}  // namespace internal
}  // namespace memsim::config
