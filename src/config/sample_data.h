// Internal to config/: the training block's "data" object (setup.h SampleData; docs/config.md,
// 'Sample lengths'): the dataset's sample lengths (a file of one length a line, a fixed length,
// a uniform range or a histogram), the collator's padding and packing, and the sampler's
// TrainingArguments (group_by_length, data_seed / seed). Read for framework "hf-trainer".
// Not modelled: the last, shorter batch of an epoch (the loader is taken as drop_last), packing
// that keeps samples apart (LLaMA-Factory neat_packing), padding_free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/documents.h"
#include "config/reader.h"
#include "config/setup.h"

namespace memsim::config::internal {

// The most samples a dataset may hold (a file's lines, a histogram's counts summed): the sampler
// keeps one epoch's permutation of them (4 bytes a sample).
inline constexpr std::int64_t kMaxDatasetSamples = std::int64_t{1} << 22;

// The lengths in the text of a lengths file, one positive integer a line; blank lines and lines
// starting with '#' are skipped. As (length, count), ascending. Errors: "<label>:<line>: ...".
std::vector<std::pair<int, std::int64_t>> ParseLengthsFile(const std::string& text,
                                                           const std::string& label);

// The lengths file `ref` names, relative to `from` (the config), read and parsed.
std::vector<std::pair<int, std::int64_t>> ReadLengthsFile(const std::string& ref,
                                                          const std::string& location,
                                                          const Document& from);

// Reads `own`'s "data" (when present) and `args`' group_by_length, data_seed and seed into
// c.data. REQUIRES: c.seq_length and c.micro_batch_size read.
void ReadSampleData(ObjectReader& own, ObjectReader& args, const Document& config,
                    TrainingConfig& c, std::vector<std::string>* notes);

}  // namespace memsim::config::internal
