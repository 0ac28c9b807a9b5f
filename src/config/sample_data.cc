#include "config/sample_data.h"

#include <algorithm>
#include <charconv>
#include <map>

#include <fmt/format.h>

namespace memsim::config::internal {
namespace {

// A length as the reader's size limit for seq_length allows (reader.cc kLimits).
constexpr int kMaxSampleLength = 1 << 26;

using LengthCounts = std::vector<std::pair<int, std::int64_t>>;

LengthCounts CountsToList(const std::map<int, std::int64_t>& counts) {
  return LengthCounts(counts.begin(), counts.end());
}

// A JSON integer in [lo, hi], else a failure at `location` saying what was expected.
std::int64_t SampleIntAt(const Json& v, std::int64_t lo, std::int64_t hi, const std::string& location,
                   const char* what) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi) {
    Fail(location, fmt::format("expected {} (an integer from {} to {}), got {}", what, lo, hi,
                               Describe(v)));
  }
  return v.get<std::int64_t>();
}

// {"uniform": [min, max]}: one sample of each length from min to max.
LengthCounts ReadUniform(const ObjectReader& r, const Json& v) {
  const std::string at = r.At("uniform");
  if (!v.is_array() || v.size() != 2) {
    Fail(at, fmt::format("expected [min, max] sample lengths, got {}", Describe(v)));
  }
  const std::int64_t lo = SampleIntAt(v[0], 1, kMaxSampleLength, at + "/0", "the shortest length");
  const std::int64_t hi = SampleIntAt(v[1], lo, kMaxSampleLength, at + "/1", "the longest length");
  if (hi - lo + 1 > kMaxDatasetSamples) {
    Fail(at, fmt::format("a range of {} lengths exceeds memsim's limit of {} samples",
                         hi - lo + 1, kMaxDatasetSamples));
  }
  LengthCounts out;
  for (std::int64_t l = lo; l <= hi; ++l) out.emplace_back(static_cast<int>(l), 1);
  return out;
}

// {"histogram": [[length, count], ...]}.
LengthCounts ReadHistogram(const ObjectReader& r, const Json& v) {
  const std::string at = r.At("histogram");
  if (!v.is_array() || v.empty()) {
    Fail(at, fmt::format("expected a non-empty list of [length, count] pairs, got {}", Describe(v)));
  }
  std::map<int, std::int64_t> counts;
  std::int64_t total = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string item = fmt::format("{}/{}", at, i);
    if (!v[i].is_array() || v[i].size() != 2) {
      Fail(item, fmt::format("expected a [length, count] pair, got {}", Describe(v[i])));
    }
    const auto length = static_cast<int>(SampleIntAt(v[i][0], 1, kMaxSampleLength, item + "/0", "a length"));
    const std::int64_t n = SampleIntAt(v[i][1], 1, kMaxDatasetSamples, item + "/1", "a sample count");
    total += n;
    if (total > kMaxDatasetSamples) {
      Fail(item, fmt::format("the counts sum to more than memsim's limit of {} samples",
                             kMaxDatasetSamples));
    }
    counts[length] += n;
  }
  return CountsToList(counts);
}

// "lengths": a file, or an object with one of fixed / uniform / histogram.
LengthCounts ReadLengths(ObjectReader& data, const Document& config) {
  const Json* v = data.Get("lengths");
  const std::string at = data.At("lengths");
  if (v->is_string()) return ReadLengthsFile(v->get<std::string>(), at, config);
  if (!v->is_object() || v->size() != 1) {
    Fail(at, fmt::format("expected a lengths file (one integer a line) or an object with one of "
                         "'fixed', 'uniform', 'histogram', got {}",
                         Describe(*v)));
  }
  ObjectReader r(data.source(), *v, data.PointerOf("lengths"));
  if (std::optional<int> fixed = r.PositiveInt("fixed")) return {{*fixed, 1}};
  if (const Json* u = r.Get("uniform")) return ReadUniform(r, *u);
  if (const Json* h = r.Get("histogram")) return ReadHistogram(r, *h);
  r.RejectUnknown({"fixed", "uniform", "histogram"});
  Fail(at, "expected one of 'fixed', 'uniform', 'histogram'");
}

}  // namespace

LengthCounts ParseLengthsFile(const std::string& text, const std::string& label) {
  std::map<int, std::int64_t> counts;
  std::int64_t total = 0;
  size_t pos = 0;
  for (int line = 1; pos < text.size(); ++line) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view s(text.data() + pos, end - pos);
    pos = end + 1;
    while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    if (s.empty() || s.front() == '#') continue;
    int value = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size() || value < 1 || value > kMaxSampleLength) {
      Fail(fmt::format("{}:{}", label, line),
           fmt::format("expected a sample length (an integer from 1 to {}), got \"{}\"",
                       kMaxSampleLength, Printable(s, 40)));
    }
    if (++total > kMaxDatasetSamples) {
      Fail(fmt::format("{}:{}", label, line),
           fmt::format("more than memsim's limit of {} samples", kMaxDatasetSamples));
    }
    ++counts[value];
  }
  if (counts.empty()) Fail(label, "no sample lengths (one integer a line; '#' starts a comment)");
  return CountsToList(counts);
}

LengthCounts ReadLengthsFile(const std::string& ref, const std::string& location, const Document& from) {
  const Document d = FindReferencedDocument(ref, location, from, "the sample lengths file");
  return ParseLengthsFile(d.text, d.label);
}

void ReadSampleData(ObjectReader& own, ObjectReader& args, const Document& config,
                    TrainingConfig& c, std::vector<std::string>* notes) {
  SampleData& out = c.data;
  // Trainer._get_train_sampler seeds the sampler from data_seed, else seed
  // (transformers/trainer.py; TrainingArguments.seed default 42).
  const std::optional<std::int64_t> seed = args.NonNegativeInt64("seed");
  const std::optional<std::int64_t> data_seed = args.NonNegativeInt64("data_seed");
  out.seed = static_cast<std::uint64_t>(data_seed.value_or(seed.value_or(42)));
  out.group_by_length = args.Bool("group_by_length").value_or(false);
  const Json* v = own.Get("data");
  if (v != nullptr) {
    ObjectReader data(own.source(), *v, own.PointerOf("data"));
    if (data.Has("lengths")) out.lengths = ReadLengths(data, config);
    const std::string padding = data.Choice("padding", {"longest", "max_length"}).value_or("longest");
    out.padding = padding == "longest" ? SampleData::Padding::kLongest : SampleData::Padding::kMaxLength;
    out.pad_to_multiple_of = data.PositiveInt("pad_to_multiple_of").value_or(0);
    out.packing = data.Bool("packing").value_or(false);
    data.RejectUnknown({"lengths", "padding", "pad_to_multiple_of", "packing"});
    if (out.packing && !out.lengths.empty()) {
      notes->push_back(fmt::format("{}: every row is {} tokens of concatenated samples (TRL "
                                   "pack_dataset), so the lengths change no shape",
                                   data.At("packing"), c.seq_length));
    }
  }
  if (!out.Varies()) {
    for (const char* key : {"group_by_length", "seed", "data_seed"}) {
      if (args.Has(key)) {
        notes->push_back(fmt::format("{}: accepted, no effect on memory (every micro-batch is "
                                     "max_seq_length long: no varying data lengths)",
                                     args.At(key)));
      }
    }
  }
}

}  // namespace memsim::config::internal
