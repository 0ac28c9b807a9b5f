#include "export/pickle_writer.h"

#include "core/check.h"

namespace memsim::exports {
namespace {

void Le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

PickleWriter::PickleWriter() { out_ = "\x80\x02"; }

void PickleWriter::BeginDict() {
  out_ += "}(";
  ++open_;
}
void PickleWriter::EndDict() {
  MEMSIM_CHECK(open_ > 0);
  out_ += 'u';
  --open_;
}
void PickleWriter::BeginList() {
  out_ += "](";
  ++open_;
}
void PickleWriter::EndList() {
  MEMSIM_CHECK(open_ > 0);
  out_ += 'e';
  --open_;
}

void PickleWriter::Int(std::int64_t v) {
  if (v >= 0 && v < 256) {
    out_ += 'K';
    Le(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out_ += 'M';
    Le(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_ += 'J';
    Le(out_, static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))), 4);
  } else {
    // LONG1: little-endian two's complement, 8 bytes always suffice for an int64.
    out_ += '\x8a';
    out_ += '\x08';
    Le(out_, static_cast<std::uint64_t>(v), 8);
  }
}

void PickleWriter::UInt(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) {
    Int(static_cast<std::int64_t>(v));
    return;
  }
  // Nine bytes: the top bit of the eighth byte is set, so a zero byte keeps the value positive.
  out_ += '\x8a';
  out_ += '\x09';
  Le(out_, v, 8);
  out_ += '\0';
}

void PickleWriter::Str(std::string_view s) {
  out_ += 'X';
  Le(out_, s.size(), 4);
  out_ += s;
}

void PickleWriter::None() { out_ += 'N'; }
void PickleWriter::Bool(bool v) { out_ += v ? '\x88' : '\x89'; }

std::string PickleWriter::Finish() {
  MEMSIM_CHECK(open_ == 0);
  out_ += '.';
  return std::move(out_);
}

}  // namespace memsim::exports
