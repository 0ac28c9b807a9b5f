#include "core/pickle.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"

namespace memsim {
namespace {

using json = nlohmann::json;

// Nesting deeper than this is refused (a snapshot nests 6 deep; a reference cycle is infinitely
// deep).
constexpr int kMaxDepth = 200;

struct Node {
  enum Kind : std::uint8_t { kNone, kBool, kInt, kUInt, kFloat, kStr, kList, kTuple, kDict };
  Kind kind = kNone;
  bool b = false;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double f = 0;
  std::string s;
  std::vector<std::int32_t> items;                             // list, tuple
  std::vector<std::pair<std::int32_t, std::int32_t>> entries;  // dict (key, value)
};

// UTF-8 as RFC 3629 defines it: no overlong forms, nothing above U+10FFFF, no surrogates
// (U+D800..U+DFFF). Python's unpickler would pass surrogates ('surrogatepass'), but JSON text
// cannot hold them, and no snapshot field memsim reads needs one.
bool IsUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n > s.size() - i - 1) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// Thrown instead of an error about the end of the input when reading a prefix.
struct PrefixEnds {};

class Unpickler {
 public:
  // `prefix`: `in` is the start of a longer pickle; running out of bytes throws PrefixEnds, and
  // Run() returns null at STOP (the value is not built).
  Unpickler(std::string_view in, std::string_view file, bool prefix = false)
      : in_(in), file_(file), prefix_(prefix) {}

  json Run() {
    while (true) {
      if (pos_ >= in_.size()) {
        if (prefix_) throw PrefixEnds{};
        throw Fail(pos_, "ends before the STOP opcode");
      }
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') break;
      Step(op);
    }
    if (!marks_.empty() || stack_.size() != 1) {
      throw Fail(op_at_, "STOP with an unbalanced stack (a truncated or malformed pickle)");
    }
    if (prefix_) return json();
    budget_ = std::max<std::size_t>(std::size_t{1} << 20, 4 * in_.size());
    return ToJson(stack_.back(), 0);
  }

 private:
  InputError Fail(std::size_t at, std::string_view what) const {
    return InputError(fmt::format("{}: pickle byte {}: {}", file_, at, what));
  }

  std::string_view Take(std::uint64_t n) {
    if (n > in_.size() - pos_) {
      if (prefix_) throw PrefixEnds{};
      throw Fail(op_at_, "a length runs past the end of the file");
    }
    std::string_view v = in_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return v;
  }
  std::uint64_t Le(int bytes) {
    std::string_view v = Take(static_cast<std::uint64_t>(bytes));
    std::uint64_t x = 0;
    for (int k = bytes - 1; k >= 0; --k) x = (x << 8) | static_cast<unsigned char>(v[static_cast<std::size_t>(k)]);
    return x;
  }

  std::int32_t Push(Node n) {
    nodes_.push_back(std::move(n));
    const auto id = static_cast<std::int32_t>(nodes_.size() - 1);
    stack_.push_back(id);
    return id;
  }
  std::int32_t Pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) throw Fail(op_at_, "stack underflow");
    const std::int32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  std::int32_t Top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) throw Fail(op_at_, "stack underflow");
    return stack_.back();
  }
  // The values above the last MARK, removed with the mark.
  std::vector<std::int32_t> PopMark() {
    if (marks_.empty()) throw Fail(op_at_, "no MARK before this opcode");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<std::int32_t> items(stack_.begin() + static_cast<long>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Node& Container(std::int32_t id, Node::Kind kind, const char* what) {
    Node& n = nodes_[static_cast<std::size_t>(id)];
    if (n.kind != kind) throw Fail(op_at_, fmt::format("{} on a value that is not a {}", what,
                                                        kind == Node::kDict ? "dict" : "list"));
    return n;
  }
  void AddPairs(Node& dict, const std::vector<std::int32_t>& items) {
    if (items.size() % 2 != 0) throw Fail(op_at_, "a dict with a key but no value");
    for (std::size_t k = 0; k < items.size(); k += 2) dict.entries.emplace_back(items[k], items[k + 1]);
  }
  void Int(std::int64_t v) {
    Node n;
    n.kind = Node::kInt;
    n.i = v;
    Push(std::move(n));
  }
  // BINUNICODE / SHORT_BINUNICODE / BINUNICODE8 hold UTF-8 (pickletools' descriptions;
  // Python's unpickler decodes them with 'utf-8', 'surrogatepass'), so bytes that are not UTF-8
  // are an error here too, rather than a string nlohmann::json cannot write later.
  void Str(std::string_view s) {
    if (!IsUtf8(s)) throw Fail(op_at_, "a string that is not valid UTF-8");
    Node n;
    n.kind = Node::kStr;
    n.s = std::string(s);
    Push(std::move(n));
  }
  void Tuple(std::vector<std::int32_t> items) {
    Node n;
    n.kind = Node::kTuple;
    n.items = std::move(items);
    Push(std::move(n));
  }
  // LONG1 / LONG4: little-endian two's complement of `n` bytes. Values in [-2^63, 2^64) are
  // read; a wider one is refused.
  void Long(std::uint64_t n) {
    std::string_view v = Take(n);
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(v[k]); };
    const bool negative = !v.empty() && (byte(v.size() - 1) & 0x80) != 0;
    for (std::size_t k = 8; k < v.size(); ++k) {
      if (byte(k) != (negative ? 0xff : 0x00)) throw Fail(op_at_, "an integer beyond 64 bits");
    }
    if (negative && v.size() > 8 && (byte(7) & 0x80) == 0) {
      throw Fail(op_at_, "an integer beyond 64 bits");
    }
    std::uint64_t x = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t k = 0; k < v.size() && k < 8; ++k) {
      x &= ~(std::uint64_t{0xff} << (8 * k));
      x |= std::uint64_t{byte(k)} << (8 * k);
    }
    Node node;
    if (!negative && x > static_cast<std::uint64_t>(INT64_MAX)) {
      node.kind = Node::kUInt;
      node.u = x;
    } else {
      node.kind = Node::kInt;
      node.i = static_cast<std::int64_t>(x);
    }
    Push(std::move(node));
  }
  void Put(std::uint64_t index) { memo_[index] = Top(); }
  void Get(std::uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) throw Fail(op_at_, fmt::format("memo reference {} never stored", index));
    stack_.push_back(it->second);
  }

  void Step(unsigned char op);
  json ToJson(std::int32_t id, int depth);

  std::string_view in_;
  std::string_view file_;
  bool prefix_ = false;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  std::vector<Node> nodes_;
  std::vector<std::int32_t> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, std::int32_t> memo_;
  std::size_t budget_ = 0;  // values ToJson may still emit
};

void Unpickler::Step(unsigned char op) {
  switch (op) {
    case 0x80: {  // PROTO
      const std::uint64_t v = Le(1);
      if (v < 2 || v > 5) throw Fail(op_at_, fmt::format("pickle protocol {}, expected 2 to 5", v));
      return;
    }
    case 0x95: Le(8); return;  // FRAME: a length hint only
    case '(': marks_.push_back(stack_.size()); return;
    case '0': Pop(); return;
    case '1': PopMark(); return;
    case '2': stack_.push_back(Top()); return;
    case '}': { Node n; n.kind = Node::kDict; Push(std::move(n)); return; }
    case ']': { Node n; n.kind = Node::kList; Push(std::move(n)); return; }
    case ')': Tuple({}); return;
    case 'd': { Node n; n.kind = Node::kDict; AddPairs(n, PopMark()); Push(std::move(n)); return; }
    case 'l': { Node n; n.kind = Node::kList; n.items = PopMark(); Push(std::move(n)); return; }
    case 't': Tuple(PopMark()); return;
    case 0x85: { const auto a = Pop(); Tuple({a}); return; }
    case 0x86: { const auto b = Pop(); const auto a = Pop(); Tuple({a, b}); return; }
    case 0x87: {
      const auto c = Pop(); const auto b = Pop(); const auto a = Pop();
      Tuple({a, b, c});
      return;
    }
    case 's': {
      const auto v = Pop(); const auto k = Pop();
      Container(Top(), Node::kDict, "SETITEM").entries.emplace_back(k, v);
      return;
    }
    case 'u': {
      std::vector<std::int32_t> items = PopMark();
      AddPairs(Container(Top(), Node::kDict, "SETITEMS"), items);
      return;
    }
    case 'a': {
      const auto v = Pop();
      Container(Top(), Node::kList, "APPEND").items.push_back(v);
      return;
    }
    case 'e': {
      std::vector<std::int32_t> items = PopMark();
      Node& list = Container(Top(), Node::kList, "APPENDS");
      list.items.insert(list.items.end(), items.begin(), items.end());
      return;
    }
    case 'J': Int(static_cast<std::int32_t>(static_cast<std::uint32_t>(Le(4)))); return;
    case 'K': Int(static_cast<std::int64_t>(Le(1))); return;
    case 'M': Int(static_cast<std::int64_t>(Le(2))); return;
    case 0x8a: Long(Le(1)); return;
    case 0x8b: Long(Le(4)); return;
    case 'G': {
      std::uint64_t bits = 0;
      for (char c : Take(8)) bits = (bits << 8) | static_cast<unsigned char>(c);  // big-endian
      Node n;
      n.kind = Node::kFloat;
      std::memcpy(&n.f, &bits, sizeof n.f);
      Push(std::move(n));
      return;
    }
    case 'X': Str(Take(Le(4))); return;
    case 0x8c: Str(Take(Le(1))); return;
    case 0x8d: Str(Take(Le(8))); return;
    case 'N': Push(Node{}); return;
    case 0x88: case 0x89: { Node n; n.kind = Node::kBool; n.b = op == 0x88; Push(std::move(n)); return; }
    case 0x94: Put(memo_.size()); return;  // MEMOIZE: the next index
    case 'q': Put(Le(1)); return;
    case 'r': Put(Le(4)); return;
    case 'h': Get(Le(1)); return;
    case 'j': Get(Le(4)); return;
    default:
      throw Fail(op_at_, fmt::format("unsupported opcode 0x{:02x}; memsim reads pickles of dicts, "
                                     "lists, tuples, strings, numbers, None and booleans only "
                                     "(torch.cuda.memory._dump_snapshot)", op));
  }
}

json Unpickler::ToJson(std::int32_t id, int depth) {
  if (depth > kMaxDepth) throw Fail(0, "nested deeper than 200 levels (or a reference cycle)");
  if (budget_ == 0) throw Fail(0, "shared references expand to too many values");
  --budget_;
  const Node& n = nodes_[static_cast<std::size_t>(id)];
  switch (n.kind) {
    case Node::kNone: return nullptr;
    case Node::kBool: return n.b;
    case Node::kInt: return n.i;
    case Node::kUInt: return n.u;
    case Node::kFloat: return std::isfinite(n.f) ? json(n.f) : json(nullptr);
    case Node::kStr: return n.s;
    case Node::kList:
    case Node::kTuple: {
      json a = json::array();
      for (std::int32_t item : n.items) a.push_back(ToJson(item, depth + 1));
      return a;
    }
    case Node::kDict: {
      json o = json::object();
      for (const auto& [k, v] : n.entries) {
        const Node& key = nodes_[static_cast<std::size_t>(k)];
        std::string name;
        if (key.kind == Node::kStr) {
          name = key.s;
        } else if (key.kind == Node::kInt) {
          name = std::to_string(key.i);
        } else if (key.kind == Node::kUInt) {
          name = std::to_string(key.u);
        } else {
          throw Fail(0, "a dict key that is not a string or an integer");
        }
        o[name] = ToJson(v, depth + 1);  // a repeated key: the last wins, as in Python
      }
      return o;
    }
  }
  return nullptr;
}

}  // namespace

bool LooksLikePickle(std::string_view head) {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 &&
         static_cast<unsigned char>(head[1]) >= 2 && static_cast<unsigned char>(head[1]) <= 5;
}

json PickleToJson(std::string_view bytes, std::string_view file_name) {
  return Unpickler(bytes, file_name).Run();
}

bool PickleNeedsMoreBytes(std::string_view prefix) {
  try {
    Unpickler(prefix, "", /*prefix=*/true).Run();
  } catch (const PrefixEnds&) {
    return true;
  } catch (const InputError&) {
    return false;  // an error more bytes cannot mend
  }
  return false;  // STOP: the pickle is whole; the bytes after it are never read
}
}  // namespace memsim
