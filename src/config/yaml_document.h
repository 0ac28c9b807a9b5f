// Internal to config/: a YAML document (a fine-tuning recipe, recipe.h) read into the JSON value
// the rest of config/ reads, with the line each key was written on. Scalars resolve as PyYAML's
// SafeLoader resolves them (YAML 1.1, yaml/resolver.py), since every tool whose recipes memsim
// reads loads them with yaml.safe_load: null (~, null, empty), booleans (true/false, yes/no,
// on/off in their three spellings), decimal integers, floats written with a dot (PyYAML reads
// "2e-5" as a string), everything else a string; a quoted scalar is always a string. Parsing is
// yaml-cpp's (Debian libyaml-cpp-dev); no tool's meaning is decided here.
#pragma once

#include <map>
#include <string>

#include "config/reader.h"

namespace memsim::config::internal {

struct YamlDocument {
  Json root;
  // JSON pointer of each mapping value -> the 1-based line its key was written on.
  std::map<std::string, int> lines;
};

// Parses `text`. Errors (InputError): "<file>:<line>:<column>: malformed YAML: <reason>", a
// duplicate key "<file>:<line>: <key>: duplicate key", nesting deeper than kMaxJsonDepth, more
// than kMaxYamlNodes values after aliases are expanded (an alias bomb), a key that is not a
// scalar.
YamlDocument ParseYaml(const std::string& text, const std::string& file);

// memsim's bound on the values of one YAML document after its aliases are expanded: a recipe
// holds a few hundred; the bound keeps "billion laughs" aliases from costing memory.
inline constexpr int kMaxYamlNodes = 100000;

}  // namespace memsim::config::internal
