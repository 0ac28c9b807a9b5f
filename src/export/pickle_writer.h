// A writer of the pickle subset a PyTorch memory snapshot needs -- dicts, lists, str, int, None,
// bool -- as Python's pickle module reads it with protocol 2 (Lib/pickletools.py documents each
// opcode). Values are written in the order the caller calls; the caller nests them:
//   BeginDict(); Str("k"); Int(1); EndDict();   // {"k": 1}
// No memo, no class references: pickle.load of the bytes needs no module of memsim or torch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memsim::exports {

class PickleWriter {
 public:
  PickleWriter();  // writes PROTO 2
  void BeginDict();  // EMPTY_DICT MARK; then key, value, key, value ...
  void EndDict();    // SETITEMS
  void BeginList();  // EMPTY_LIST MARK
  void EndList();    // APPENDS
  void Int(std::int64_t v);   // BININT1 / BININT2 / BININT, or LONG1 outside int32
  void UInt(std::uint64_t v); // addresses and handles up to 2^64 - 1 (LONG1)
  void Str(std::string_view s);  // BINUNICODE (UTF-8 as given)
  void None();
  void Bool(bool v);
  // Ends the pickle (STOP) and returns its bytes. REQUIRES: every Begin closed.
  std::string Finish();

 private:
  std::string out_;
  int open_ = 0;
};

}  // namespace memsim::exports
