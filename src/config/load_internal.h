// Internal to config/: the steps of LoadSetup (load.h) that other entry points share -- the
// command-line edits of a parsed training config and the reading of one into a Setup. Used by
// load.cc and megatron_args.cc; includes nlohmann/json.
#pragma once

#include "config/documents.h"
#include "config/load.h"
#include "config/reader.h"

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
// values are named through `source`. Errors as LoadSetup's.
Setup LoadParsedConfig(const Document& config, const Json& root, const Source& source,
                       const LoadOptions& options, FieldErrors field_errors = FieldErrors::kFirst);

}  // namespace memsim::config::internal
