// A CPU allocator that wraps PyTorch's own (c10/core/CPUAllocator.h GetCPUAllocator) and counts
// every storage allocation and free with its request size, so that the oracle recorder knows the
// exact bytes alive at any point of a training step on CPU. Loaded into the Python process with
// ctypes after `import torch`: its static initializer installs it with SetCPUAllocator at a
// priority above the default one's (0, CPUAllocator.cpp REGISTER_ALLOCATOR), so every later
// at::empty on CPU goes through it. Storages made before it was loaded free through their own
// deleter and are not counted.
//
// C interface (ctypes): oracle_alive() bytes alive now; oracle_peak() the highest alive value since
// the last oracle_reset_peak(); oracle_events() allocations + frees so far; oracle_trace(path)
// starts writing one line per event ("A bytes" / "F bytes") and per oracle_mark(label) ("M label")
// to `path`; oracle_trace_close() ends it. Sizes in bytes.
//
// Build: g++ -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=<torch's ABI>
//   -I<torch>/include alloc_log.cpp -L<torch>/lib -lc10 -o alloc_log.so  (record.py does this).
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace {

std::mutex g_mu;
std::int64_t g_alive = 0, g_peak = 0, g_events = 0;
std::FILE* g_trace = nullptr;

struct Held {
  c10::DataPtr inner;
  std::int64_t bytes;
};

void Note(char kind, std::int64_t bytes) {
  ++g_events;
  if (g_trace != nullptr) std::fprintf(g_trace, "%c %lld\n", kind, static_cast<long long>(bytes));
}

// By data pointer: some kernels (mkldnn's) require a CPU DataPtr's context to be its data
// (DataPtr::cast_context), so the context cannot be the Held record itself.
std::unordered_map<void*, Held*>& Table() {
  static auto* table = new std::unordered_map<void*, Held*>();
  return *table;
}

// The wrapped allocator's raw deleter, for memory it handed out before the wrapper came.
c10::DeleterFnPtr g_base_raw_deleter = nullptr;

void Release(void* data) {
  Held* held = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Table().find(data);
    if (it == Table().end()) {
      if (g_base_raw_deleter != nullptr) g_base_raw_deleter(data);
      return;
    }
    held = it->second;
    Table().erase(it);
    g_alive -= held->bytes;
    Note('F', held->bytes);
  }
  delete held;  // frees the memory through the wrapped allocator's own deleter
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    const c10::Device device = inner.device();
    auto* held = new Held{std::move(inner), static_cast<std::int64_t>(n)};
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_alive += held->bytes;
      if (g_alive > g_peak) g_peak = g_alive;
      Note('A', held->bytes);
      Table()[data] = held;
    }
    return {data, data, &Release, device};
  }
  // raw_allocate / raw_deallocate (used by mkldnn) need it; context == data makes it valid.
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }

 private:
  c10::Allocator* base_;
};

struct Installer {
  Installer() {
    c10::Allocator* base = c10::GetCPUAllocator();
    g_base_raw_deleter = base->raw_deleter();
    static CountingAllocator counting(base);
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  }
} g_installer;

}  // namespace

extern "C" {
std::int64_t oracle_alive() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_alive;
}
std::int64_t oracle_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_peak;
}
void oracle_reset_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_peak = g_alive;
}
std::int64_t oracle_events() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_events;
}
int oracle_trace(const char* path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_trace != nullptr) std::fclose(g_trace);
  g_trace = std::fopen(path, "w");
  return g_trace != nullptr ? 0 : -1;
}
void oracle_mark(const char* label) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_trace != nullptr) std::fprintf(g_trace, "M %s %lld\n", label, static_cast<long long>(g_alive));
}
void oracle_trace_close() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_trace != nullptr) std::fclose(g_trace);
  g_trace = nullptr;
}
}
