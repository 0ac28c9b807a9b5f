// The common facts of a Setup (facts.h); the stack adds its own (config::Stack::SetFacts).
#include "workload/facts.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "config/stack.h"

namespace memsim::workload {

// First releases with the cached dummy wgrad (see SetWeightGradRules).
// Transformer Engine: estimate 2.3. `get_dummy_wgrad` came with TE PR #1651 ("Enable reuse of
// dummy wgrad tensor", opened 2025-04-07); 2.3 is the first release after it (2025-05-14), and
// TE PR #2097 (2025-08-21) already builds on it; not checked against the 2.3 tag.
const std::vector<int> kTeDummyWgradCacheSince = {2, 3};
// Megatron-core: 0.14. tensor_parallel/layers.py imports get_dummy_wgrad under HAVE_TE from
// core_v0.14.0 (and in current main); core_v0.13.0 and before make a fresh tensor (read for
// docs/validation.md, 'Fifth pass').
const std::vector<int> kMegatronDummyWgradCacheSince = {0, 14};

namespace {

bool NameSuggestsHopperOrLater(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* tag : {"h100", "h200", "h800", "h20", "gh200", "b100", "b200", "gb200"}) {
    if (name.find(tag) != std::string::npos) return true;
  }
  return false;
}

// With gradient-accumulation fusion, the wgrad GEMM accumulates into main_grad and the layer
// hands autograd a dummy weight-sized tensor (Megatron-core DDP sets grad_added_to_main_grad).
// Transformer Engine's get_dummy_wgrad (transformer_engine/pytorch/module/base.py) keeps one
// such tensor per (shape, dtype) for the whole run; its linear modules use it from release
// kTeDummyWgradCacheSince on (before: a fresh torch.empty per backward), and Megatron's
// tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication uses it when
// Transformer Engine is importable from Megatron-core kMegatronDummyWgradCacheSince on. Versions
// not stated are taken as current releases; torch_npu has no Transformer Engine.
void SetWeightGradRules(const config::TrainingConfig& tc, FrameworkFacts* f) {
  f->grad_accum_fusion = tc.gradient_accumulation_fusion;
  const bool have_te = !f->npu && (f->te || !tc.transformer_engine_version.empty());
  f->te_dummy_wgrad_cache = have_te && f->grad_accum_fusion &&
                            AtLeast(tc.transformer_engine_version, kTeDummyWgradCacheSince);
  f->megatron_dummy_wgrad_cache =
      have_te && f->grad_accum_fusion &&
      AtLeast(tc.transformer_engine_version, kTeDummyWgradCacheSince) &&
      AtLeast(tc.megatron_core_version, kMegatronDummyWgradCacheSince);
}

}  // namespace

bool AtLeast(const std::vector<int>& version, const std::vector<int>& since) {
  return version.empty() || version >= since;
}

FrameworkFacts ComputeFacts(const config::Setup& setup, const ModelDims& d) {
  const config::TrainingConfig& tc = setup.training;
  FrameworkFacts f;
  f.flash = tc.use_flash_attn;
  f.te = tc.transformer_impl == "transformer_engine";
  f.npu = setup.device.allocator_backend == alloc::Backend::kNpu;
  // sm >= 90 decides the TE and cuBLAS workspace sizes (kernels.h). The preset carries no
  // compute capability, so this is an estimate: the device name, or bf16 peak above 400 TFLOP/s
  // (A100: 312, H100: 989).
  f.hopper = !f.npu && (NameSuggestsHopperOrLater(setup.device.name) ||
                        setup.device.peak_flops_bf16 > 400e12);
  const auto& mods = tc.recompute_modules;
  f.attention_mask_to_backward =
      tc.recompute_granularity == config::RecomputeGranularity::kFull ||
      (tc.recompute_granularity == config::RecomputeGranularity::kSelective &&
       std::find(mods.begin(), mods.end(), "core_attn") != mods.end());
  SetWeightGradRules(tc, &f);
  config::StackOf(tc).SetFacts(setup, d, &f);
  f.te_flash_attn2 = f.te && f.flash && !f.npu && !f.hopper && !f.hf && d.cp == 1;
  return f;
}

}  // namespace memsim::workload
