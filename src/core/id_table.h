// IdTable: a map from nonzero 64-bit ids (tensor ids) to small values, for the tables the
// generator and the engine look up once or twice per tensor (docs/performance.md, 'Fewer
// allocations per tensor'). Open addressing with linear probing in one array: no heap
// allocation per entry, unlike std::unordered_map, whose node per insert and free per erase
// were a tenth of a run's instructions. Deletion shifts later entries back (no tombstones), so
// lookups stay short however many ids come and go. The array doubles at half full and never
// shrinks: it is as large as the most entries ever held at once, not the ids ever inserted.
// Id 0 is reserved (it marks an empty slot). Iteration order (ForEach) is unspecified: use it
// only where the order cannot matter (style rule 6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/check.h"

namespace memsim {

template <typename V>
class IdTable {
 public:
  // The value of `id`, or nullptr.
  V* Find(std::uint64_t id) {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = Home(id);; i = (i + 1) & Mask()) {
      if (slots_[i].id == id) return &slots_[i].value;
      if (slots_[i].id == 0) return nullptr;
    }
  }
  const V* Find(std::uint64_t id) const { return const_cast<IdTable*>(this)->Find(id); }
  bool Contains(std::uint64_t id) const { return Find(id) != nullptr; }

  // Inserts (id, value); returns false (and changes nothing) iff `id` is present.
  // REQUIRES: id != 0.
  bool Insert(std::uint64_t id, V value) {
    MEMSIM_CHECK(id != 0);
    if (2 * (size_ + 1) > slots_.size()) Grow();
    std::size_t i = Home(id);
    for (; slots_[i].id != 0; i = (i + 1) & Mask()) {
      if (slots_[i].id == id) return false;
    }
    slots_[i] = Slot{id, std::move(value)};
    ++size_;
    return true;
  }

  // Removes `id`; returns whether it was present.
  bool Erase(std::uint64_t id) {
    if (slots_.empty()) return false;
    std::size_t hole = Home(id);
    for (; slots_[hole].id != id; hole = (hole + 1) & Mask()) {
      if (slots_[hole].id == 0) return false;
    }
    // Backward shift: move up every later entry of the probe run whose home does not lie
    // cyclically in (hole, j], so that no lookup meets the hole before its entry.
    for (std::size_t j = (hole + 1) & Mask(); slots_[j].id != 0; j = (j + 1) & Mask()) {
      const std::size_t home = Home(slots_[j].id);
      const bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (stays) continue;
      slots_[hole] = std::move(slots_[j]);
      hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Calls f(id, value) for every entry, in an unspecified order.
  template <typename F>
  void ForEach(F f) const {
    for (const Slot& s : slots_) {
      if (s.id != 0) f(s.id, s.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t id = 0;  // 0: empty
    V value{};
  };

  std::size_t Mask() const { return slots_.size() - 1; }
  // Fibonacci hashing: consecutive ids land far apart.
  std::size_t Home(std::uint64_t id) const {
    return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::size_t n = old.empty() ? 16 : 2 * old.size();
    slots_.assign(n, Slot{});
    shift_ = 64;
    for (std::size_t k = n; k > 1; k >>= 1) --shift_;
    size_ = 0;
    for (Slot& s : old) {
      if (s.id != 0) Insert(s.id, std::move(s.value));
    }
  }

  std::vector<Slot> slots_;  // size 0 or a power of two
  std::size_t size_ = 0;
  int shift_ = 64;  // 64 - log2(slots_.size())
};

}  // namespace memsim
