// Internal to config/: the documents a Setup is read from -- the training config, the model file
// and the device preset it names -- on disk or embedded in the binary (embedded.h), how a
// reference written in one document resolves, and the command-line edits (--set) applied to the
// training config before it is read. Finds and reads texts; interprets nothing but references.
// Errors are InputError naming where the reference was written.
#pragma once

#include <optional>
#include <string>

#include "config/reader.h"

namespace memsim::config::internal {

// A text and how to name it: a disk path, or "<embedded>/<relative path>".
struct Document {
  std::string label;  // shown in messages and kept in Setup
  std::string text;
  bool embedded = false;
  std::string embedded_path;  // relative path within the embedded set
};

// The training config at `config_path`, or the embedded configs/default.json when it is empty
// and `use_embedded_default` is true. Errors: "no config file given", "<path>: cannot read the
// config file".
Document ReadConfigDocument(const std::string& config_path, bool use_embedded_default);

// A model file by shipped name ("llama2-7b": the embedded models/NAME.json) or by path (contains
// '/' or ends ".json"), relative to the document `from`, or to the working directory when `from`
// is null. `location` names where the reference was written.
Document FindModelDocument(const std::string& ref, const std::string& location, const Document* from);

// A device preset file by preset name (the embedded configs/devices/NAME.json) or by path,
// resolved as FindModelDocument does.
Document FindDeviceDocument(const std::string& ref, const std::string& location, const Document* from);

// Another JSON file a document refers to by path (a TrainingArguments JSON, an
// adapter_config.json), relative to `from`. A directory is read as the directory's
// `file_in_directory` when that is given (PEFT's save_pretrained folder holds adapter_config.json:
// peft/config.py PeftConfigMixin.from_pretrained reads os.path.join(path, CONFIG_NAME)). Errors:
// "<location>: cannot read <what> '<path>': <why>", or for a directory without that file
// "<location>: cannot read <what>: '<dir>' is a directory and its <file> cannot be read: <why>".
Document FindReferencedDocument(const std::string& ref, const std::string& location,
                                const Document& from, const std::string& what,
                                const std::string& file_in_directory = "");

// The embedded preset names, comma-separated ("a100-40g, a100-80g, ..."), for messages.
std::string KnownDevices();

// Applies one --set KEY=VALUE to the parsed training config `root` and records in `source` that
// the value at its JSON pointer is named by the --set text. KEY is "training.<key>" or
// "allocator.<key>"; VALUE is JSON, else a plain string; True/False are booleans.
void ApplyOverride(const std::string& text, Json* root, Source* source);

// Whether the config `root`'s training block names a stack that reads Hugging Face
// TrainingArguments names (stack.h StackTraits::training_arguments_keys); false when the block or
// its "framework" is absent, not of its type, or names no stack.
bool TrainingArgumentsKeys(const Json& root);

}  // namespace memsim::config::internal
