// memsim's own stacks, one line each (config/stack.h BuiltinStacks; docs/architecture.md, "How
// to add a stack"). The order is the one messages list them in.
#include "stacks/stacks.h"

namespace memsim::config {

std::vector<std::unique_ptr<const Stack>> BuiltinStacks() {
  std::vector<std::unique_ptr<const Stack>> out;
  out.push_back(stacks::NewMegatronStack());
  out.push_back(stacks::NewPyTorchStack());
  out.push_back(stacks::NewHfTrainerStack());
  out.push_back(stacks::NewTorchtitanStack());
  return out;
}

}  // namespace memsim::config
