// A YAML document as JSON with the line of each key (yaml_document.h), through yaml-cpp.
#include "config/yaml_document.h"

#include <cctype>
#include <regex>
#include <string_view>

#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include "core/error.h"

namespace memsim::config::internal {
namespace {

// PyYAML's implicit resolvers (yaml/resolver.py, class Resolver) for the plain scalars recipes
// hold; sexagesimal and binary integers are left out (a string here).
bool YamlIsNull(std::string_view s) { return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL"; }

std::optional<bool> YamlBool(std::string_view s) {
  for (std::string_view t : {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}) {
    if (s == t) return true;
  }
  for (std::string_view f : {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}) {
    if (s == f) return false;
  }
  return std::nullopt;
}

Json YamlScalar(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted: never resolved
  if (YamlIsNull(s)) return Json();
  if (const std::optional<bool> b = YamlBool(s)) return *b;
  static const std::regex kInt("[-+]?(0|[1-9][0-9_]*)");
  static const std::regex kFloat(R"([-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?)");
  std::string digits;
  for (char c : s) {
    if (c != '_') digits += c;
  }
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(digits);
    } catch (const std::out_of_range&) {
      return std::stod(digits);
    }
  }
  if (s != "." && std::regex_match(s, kFloat)) return std::stod(digits);
  return s;
}

struct YamlConverter {
  const std::string& file;
  YamlDocument* out;
  int nodes = 0;

  int Line(const YAML::Node& n) const { return n.Mark().line + 1; }

  Json Convert(const YAML::Node& node, const std::string& pointer, int depth) {
    if (++nodes > kMaxYamlNodes) {
      throw InputError(fmt::format("{}:{}: more than {} values (aliases expanded): memsim's limit "
                                   "for a recipe",
                                   file, Line(node), kMaxYamlNodes));
    }
    if (depth > kMaxJsonDepth) {
      throw InputError(fmt::format("{}:{}: YAML nested deeper than memsim's limit of {} levels",
                                   file, Line(node), kMaxJsonDepth));
    }
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        return Json();
      case YAML::NodeType::Scalar:
        return YamlScalar(node);
      case YAML::NodeType::Sequence: {
        Json a = Json::array();
        for (const YAML::Node& item : node) {
          a.push_back(Convert(item, Child(pointer, std::to_string(a.size())), depth + 1));
        }
        return a;
      }
      case YAML::NodeType::Map:
        return ConvertMap(node, pointer, depth);
    }
    return Json();
  }

  Json ConvertMap(const YAML::Node& node, const std::string& pointer, int depth) {
    Json o = Json::object();
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        throw InputError(fmt::format("{}:{}: a key that is not a plain value (memsim reads "
                                     "recipes whose keys are names)",
                                     file, Line(kv.first)));
      }
      const std::string key = kv.first.Scalar();
      if (o.contains(key)) {
        throw InputError(fmt::format("{}:{}: {}: duplicate key", file, Line(kv.first), Printable(key)));
      }
      const std::string child = Child(pointer, key);
      out->lines[child] = Line(kv.first);
      o[key] = Convert(kv.second, child, depth + 1);
    }
    return o;
  }
};

}  // namespace

YamlDocument ParseYaml(const std::string& text, const std::string& file) {
  YamlDocument doc;
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}:{}:{}: malformed YAML: {}", file, e.mark.line + 1,
                                 e.mark.column + 1, Printable(e.msg)));
  }
  YamlConverter c{file, &doc};
  try {
    doc.root = c.Convert(node, "", 1);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}:{}:{}: malformed YAML: {}", file, e.mark.line + 1,
                                 e.mark.column + 1, Printable(e.msg)));
  }
  return doc;
}

}  // namespace memsim::config::internal
