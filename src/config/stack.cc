// The stack registry (stack.h): the one place that maps the training block's "framework" name
// to its stack.
#include "config/stack.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

namespace memsim::config {
namespace {

// The built-ins come first, in BuiltinStacks' order; made on first use (a thread-safe static).
std::vector<std::unique_ptr<const Stack>>& Stacks() {
  static std::vector<std::unique_ptr<const Stack>> stacks = BuiltinStacks();
  return stacks;
}

}  // namespace

void RegisterStack(std::unique_ptr<const Stack> stack) {
  MEMSIM_CHECK(stack != nullptr);
  std::vector<std::unique_ptr<const Stack>>& stacks = Stacks();
  MEMSIM_CHECK(FindStack(stack->Name()) == nullptr);
  stacks.push_back(std::move(stack));
}

void UnregisterStack(std::string_view name) {
  std::vector<std::unique_ptr<const Stack>>& stacks = Stacks();
  const std::vector<std::unique_ptr<const Stack>> builtins = BuiltinStacks();
  for (const std::unique_ptr<const Stack>& b : builtins) MEMSIM_CHECK(b->Name() != name);
  const auto it = std::find_if(stacks.begin(), stacks.end(),
                               [&](const std::unique_ptr<const Stack>& s) { return s->Name() == name; });
  MEMSIM_CHECK(it != stacks.end());
  stacks.erase(it);
}

const Stack* FindStack(std::string_view name) {
  for (const std::unique_ptr<const Stack>& s : Stacks()) {
    if (s->Name() == name) return s.get();
  }
  return nullptr;
}

const Stack& StackOf(const TrainingConfig& c) {
  const Stack* s = FindStack(c.framework);
  MEMSIM_CHECK(s != nullptr);
  return *s;
}

std::vector<std::string> StackNames() {
  std::vector<std::string> names;
  for (const std::unique_ptr<const Stack>& s : Stacks()) names.emplace_back(s->Name());
  return names;
}

std::string QuotedStackNames() {
  const std::vector<std::string> names = StackNames();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
    out += fmt::format("\"{}\"", names[i]);
  }
  return out;
}

}  // namespace memsim::config
