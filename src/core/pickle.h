// A reader of Python pickles made of plain values -- what torch.cuda.memory._dump_snapshot
// and torch_npu's twin write (pickle.dump of dicts, lists, tuples, str, int, float, None, bool;
// protocols 2 to 5) -- into a JSON value: dict -> object, list and tuple -> array, str ->
// string, int -> integer (int64, or uint64 up to 2^64 - 1 for addresses), float -> number
// (NaN and infinities -> null), None -> null, bool -> bool. Opcodes read (Lib/pickletools.py):
// PROTO, FRAME, STOP, MARK, POP, POP_MARK, DUP, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, DICT, LIST,
// TUPLE, TUPLE1-3, SETITEM(S), APPEND(S), BININT, BININT1, BININT2, LONG1, LONG4, BINFLOAT,
// BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, NONE, NEWTRUE, NEWFALSE, MEMOIZE, BINPUT,
// LONG_BINPUT, BINGET, LONG_BINGET. Anything else (class references such as GLOBAL or REDUCE,
// bytes, sets, protocol 0/1 text opcodes) is refused: memsim never runs code from a pickle.
// Every length and reference is checked against the input; shared references are expanded
// within a budget (a few times the input size), so a small file cannot grow without bound.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace memsim {

// True iff `head` starts like a pickle of protocol 2 to 5 (PROTO opcode 0x80, then 2..5).
bool LooksLikePickle(std::string_view head);

// Throws InputError "<file_name>: pickle byte <n>: <what was wrong>".
nlohmann::json PickleToJson(std::string_view bytes, std::string_view file_name);

// For a reader of a pickle still arriving (a pipe, an endless stream, gigabytes of gzip): true
// iff PickleToJson of `prefix`, the bytes so far, would fail only for want of more bytes. False
// when the prefix already holds an error more bytes cannot mend (an opcode memsim refuses, a
// reference to nothing: PickleToJson of the whole throws the same error as of the prefix) or
// the whole pickle (its STOP: the bytes after it are never read), so reading can stop there.
// Costs what unpickling the prefix costs, without building its value.
bool PickleNeedsMoreBytes(std::string_view prefix);
}  // namespace memsim
