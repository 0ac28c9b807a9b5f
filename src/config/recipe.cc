// A fine-tuning recipe as a framework "hf-trainer" training config (recipe.h): which tool wrote
// it, its model's hub id, and the reading shared by the tool readers.
#include "config/recipe.h"

#include <algorithm>
#include <filesystem>

#include <fmt/core.h>

#include "config/embedded.h"
#include "config/hf_trainer.h"
#include "config/load_internal.h"
#include "core/error.h"
#include "core/read_file.h"

namespace memsim::config::internal {
namespace {

namespace fs = std::filesystem;

// A config.json is kilobytes; the bound only stops an endless file (as documents.cc's).
constexpr std::int64_t kMaxHubConfigBytes = std::int64_t{1} << 26;

std::string RecipeDescribe(const Json& v) { return Describe(v); }

bool RecipeUnset(const Json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         (v.is_array() && v.empty()) || (v.is_object() && v.empty());
}

// The snapshot config.json of `id` under one cache directory: models--ORG--NAME/snapshots/*/;
// the most recently written one when there are several.
std::optional<std::string> CachedConfig(const std::string& dir, const std::string& id) {
  std::string folder = "models--" + id;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/', p + 2)) {
    folder.replace(p, 1, "--");
  }
  std::error_code ec;
  const fs::path snapshots = fs::path(dir) / folder / "snapshots";
  if (!fs::is_directory(snapshots, ec)) return std::nullopt;
  std::optional<fs::path> best;
  fs::file_time_type best_time{};
  std::vector<fs::path> found;
  for (const fs::directory_entry& e : fs::directory_iterator(snapshots, ec)) {
    const fs::path file = e.path() / "config.json";
    if (fs::is_regular_file(file, ec)) found.push_back(file);
  }
  std::sort(found.begin(), found.end());  // ties broken by name, deterministic
  for (const fs::path& file : found) {
    const fs::file_time_type t = fs::last_write_time(file, ec);
    if (!best || t > best_time) {
      best = file;
      best_time = t;
    }
  }
  if (!best) return std::nullopt;
  return best->lexically_normal().generic_string();
}

// The shipped model whose "_hub_ids" lists `id`, as its embedded path.
std::optional<std::string> CatalogueModel(const std::string& id, std::vector<std::string>* ids) {
  std::optional<std::string> hit;
  for (const EmbeddedFile& f : EmbeddedFiles()) {
    if (!f.path.starts_with("models/") || !f.path.ends_with(".json")) continue;
    const Json j = Json::parse(f.text, nullptr, false);
    if (!j.is_object() || !j.contains("_hub_ids") || !j["_hub_ids"].is_array()) continue;
    for (const Json& h : j["_hub_ids"]) {
      if (!h.is_string()) continue;
      ids->push_back(h.get<std::string>());
      if (h.get<std::string>() == id && !hit) hit = std::string(f.path);
    }
  }
  return hit;
}

}  // namespace

bool IsYamlRecipe(const Document& config) {
  const std::string ext = fs::path(config.label).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

std::vector<std::string> HubCacheDirs(const std::function<const char*(const char*)>& getenv) {
  auto set = [&](const char* name) -> std::optional<std::string> {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
  if (auto v = set("HF_HUB_CACHE")) return {*v};
  if (auto v = set("HUGGINGFACE_HUB_CACHE")) return {*v};  // the older name, still read
  if (auto v = set("HF_HOME")) return {(fs::path(*v) / "hub").generic_string()};
  if (auto v = set("XDG_CACHE_HOME")) return {(fs::path(*v) / "huggingface" / "hub").generic_string()};
  if (auto v = set("HOME")) return {(fs::path(*v) / ".cache" / "huggingface" / "hub").generic_string()};
  return {};
}

Document FindHubModel(const std::string& ref, const std::string& location, const Document& recipe,
                      const std::vector<std::string>& cache_dirs, std::string* how) {
  std::error_code ec;
  fs::path dir(ref);
  if (dir.is_relative()) dir = fs::path(recipe.label).parent_path() / dir;
  const bool hub_id = !ref.empty() && ref.front() != '/' && ref.front() != '.' &&
                      std::count(ref.begin(), ref.end(), '/') == 1;
  if (fs::is_directory(dir, ec) || !hub_id) {
    *how = "directory";
    return FindModelDocument(ref, location, &recipe);
  }
  for (const std::string& cache : cache_dirs) {
    if (const std::optional<std::string> file = CachedConfig(cache, ref)) {
      std::optional<std::string> text = ReadBoundedFile(*file, Printable(*file), kMaxHubConfigBytes, "a JSON file");
      if (!text) Fail(location, fmt::format("cannot read {}: {}", Printable(*file), WhyUnreadable(*file)));
      *how = "HF cache";
      return Document{*file, std::move(*text), false, ""};
    }
  }
  std::vector<std::string> known;
  if (const std::optional<std::string> shipped = CatalogueModel(ref, &known)) {
    *how = "shipped catalogue";
    return FindModelDocument(fs::path(*shipped).stem().string(), location, nullptr);
  }
  std::string looked;
  for (const std::string& cache : cache_dirs) looked += (looked.empty() ? "" : ", ") + cache;
  std::string message = fmt::format(
      "model '{}' is not in the Hugging Face cache ({}) nor in memsim's catalogue of shipped "
      "models; pass --model DIR (a downloaded model's directory with its config.json), --model "
      "FILE or --model NAME",
      Printable(ref), looked.empty() ? "no HOME, HF_HOME or HF_HUB_CACHE set" : looked);
  const std::string guess = ClosestMatch(ref, known);
  if (!guess.empty()) message += fmt::format(" (did you mean '{}'?)", guess);
  Fail(location, message);
}

// ---- RecipeReader ----

RecipeReader::RecipeReader(const Document& doc, const YamlDocument& yaml, std::string tool)
    : doc_(doc), yaml_(yaml), tool_(std::move(tool)) {}

const Json* RecipeReader::Lookup(std::string_view key) const {
  const auto it = yaml_.root.find(std::string(key));
  if (it == yaml_.root.end() || it->is_null()) return nullptr;
  return &*it;
}

bool RecipeReader::Has(std::string_view key) const { return Lookup(key) != nullptr; }

const Json* RecipeReader::Get(std::string_view key) {
  read_.insert(std::string(key));
  return Lookup(key);
}

void RecipeReader::Skip(std::string_view key) { read_.insert(std::string(key)); }

std::string RecipeReader::At(std::string_view key) const {
  const auto it = yaml_.lines.find(Child("", key));
  if (it == yaml_.lines.end()) return fmt::format("{}: {} (absent: {} default)", doc_.label, key, tool_);
  return fmt::format("{}:{}: {}", doc_.label, it->second, key);
}

std::optional<bool> RecipeReader::Bool(std::string_view key) {
  const Json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) Fail(At(key), fmt::format("expected true or false, got {}", RecipeDescribe(*v)));
  return v->get<bool>();
}

std::optional<std::int64_t> RecipeReader::PositiveInt(std::string_view key) {
  const Json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer() || v->get<std::int64_t>() <= 0) {
    Fail(At(key), fmt::format("expected a positive integer, got {}", RecipeDescribe(*v)));
  }
  return v->get<std::int64_t>();
}

std::optional<double> RecipeReader::Number(std::string_view key) {
  const Json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) Fail(At(key), fmt::format("expected a number, got {}", RecipeDescribe(*v)));
  return v->get<double>();
}

std::optional<std::string> RecipeReader::String(std::string_view key) {
  const Json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) Fail(At(key), fmt::format("expected a string, got {}", RecipeDescribe(*v)));
  return v->get<std::string>();
}

std::optional<std::vector<std::string>> RecipeReader::Strings(std::string_view key, bool split_commas) {
  const Json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  std::vector<std::string> out;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (!split_commas) return std::vector<std::string>{s};
    size_t start = 0;
    while (start <= s.size()) {
      const size_t end = std::min(s.find(',', start), s.size());
      std::string item = s.substr(start, end - start);
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      if (!item.empty()) out.push_back(item);
      start = end + 1;
    }
    return out;
  }
  if (!v->is_array()) Fail(At(key), fmt::format("expected a string or a list of strings, got {}", RecipeDescribe(*v)));
  for (const Json& item : *v) {
    if (!item.is_string()) Fail(At(key), fmt::format("expected a list of strings, got {}", RecipeDescribe(*v)));
    out.push_back(item.get<std::string>());
  }
  return out;
}

void RecipeReader::Set(std::string_view key, Json value, const std::string& label) {
  const Json::json_pointer p("/" + std::string(key));
  training_[p] = std::move(value);
  labels_["/training/" + std::string(key)] = label;
}

bool RecipeReader::IsSet(std::string_view key) const {
  return training_.contains(Json::json_pointer("/" + std::string(key)));
}

void RecipeReader::RejectStack(std::string_view key, std::string_view what) {
  const Json* v = Get(key);
  if (v == nullptr || RecipeUnset(*v)) return;
  throw UnsupportedError(fmt::format("{}: {} ({} {})", At(key), what, tool_, RecipeDescribe(*v)));
}

void RecipeReader::WarnIfSet(std::string_view key, std::string_view what,
                             NotModelled::Direction errs) {
  const Json* v = Get(key);
  if (v == nullptr || RecipeUnset(*v)) return;
  Warn(fmt::format("{}: {} {} {}: {}", At(key), tool_, key, RecipeDescribe(*v), what));
  not_modelled_.push_back({At(key), std::string(key), {RecipeDescribe(*v)}, errs, true});
}

void RecipeReader::PassTrainingArguments() {
  for (auto it = yaml_.root.begin(); it != yaml_.root.end(); ++it) {
    if (read_.count(it.key()) != 0 || !IsTrainingArgumentsField(it.key())) continue;
    read_.insert(it.key());
    if (it->is_null()) continue;  // None: TrainingArguments' default
    if (!IsSet(it.key())) Set(it.key(), *it, At(it.key()));
  }
}

void RecipeReader::WarnUnread(const std::vector<std::string>& vocabulary,
                              const std::set<std::string>& no_effect) {
  for (auto it = yaml_.root.begin(); it != yaml_.root.end(); ++it) {
    const std::string& key = it.key();
    if (read_.count(key) != 0) continue;
    if (no_effect.count(key) != 0) {
      Note(fmt::format("{}: no effect on device memory", At(key)));
    } else if (std::find(vocabulary.begin(), vocabulary.end(), key) != vocabulary.end()) {
      if (it->is_null()) continue;  // None: the tool's default, nothing asked
      Warn(fmt::format("{}: {} key not read by memsim (its effect is not simulated)", At(key), tool_));
    } else {
      const std::string guess = ClosestMatch(key, vocabulary);
      Warn(fmt::format("{}: not a {} key; ignored{}", At(key), tool_,
                       guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess)));
    }
  }
}

}  // namespace memsim::config::internal
