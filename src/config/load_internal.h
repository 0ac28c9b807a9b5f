// Internal to config/: the steps of LoadSetup (load.h) that other entry points share -- the
// command-line edits of a parsed training config and the reading of one into a Setup. Used by
// load.cc and megatron_args.cc; includes nlohmann/json.
#pragma once

#include "config/documents.h"
#include "config/load.h"
#include "config/reader.h"
#include "core/error.h"

namespace memsim::config::internal {

// Applies --set (in order) and --iterations to the parsed training config `root`, recording in
// `source` the labels that name those values.
void ApplyCommandLine(const LoadOptions& options, Json* root, Source* source);

// How LoadParsedConfig reports the field errors of a document (reader.h Source::field_errors):
// all of them in one message (a JSON config the user wrote, or one memsim built from a launch or
// a recipe, whose Source labels name the user's flag or key), or the first (a config memsim
// derived itself, config::LoadVariant).
enum class FieldErrors { kFirst, kAll };

// Reads, checks and derives a Setup from the parsed training config `root` of `config`, whose
// values are named through `source`. Errors as LoadSetup's. `earlier`: errors found before the
// document was built (a launch's flags whose values could not be read, left out of `root`),
// reported with its field errors (FieldErrors::kAll).
Setup LoadParsedConfig(const Document& config, const Json& root, const Source& source,
                       const LoadOptions& options, FieldErrors field_errors = FieldErrors::kFirst,
                       const std::vector<KeyError>& earlier = {});

// The field errors of one document, a config or a model file (reader.h Source::field_errors),
// and `stop`, the error that stopped the reading if any (nullptr: none), as one InputError: a
// single message as it is, else "N problems in <label>:" and one per line. `stop` is left out
// when it may follow from a field error (a bad value reads as absent, so "missing key" or a
// disagreement may follow from it: a stop at the key of a field error, or naming the flag at
// the end of its location); the keys after it were not read, which a last line says.
[[noreturn]] void ThrowFieldErrors(const std::vector<KeyError>& errors, const std::string& label,
                                   const InputError* stop);

}  // namespace memsim::config::internal
