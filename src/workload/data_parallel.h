// DataParallel: the data-parallel wrapper around a rank's model chunks, behind one interface
// with a hook wherever a real wrapper acts: setup (its buffers, after the model is built), each
// gradient handed to autograd, before and after the backward of each gradient site, the end of
// each backward_step, the end of a model chunk's last backward, the grad sync that
// finalize_model_grads waits for, zero_grad, after the optimizer step; plus the static sizes it
// holds and the parameter shard the optimizer updates. (GradSite names the forward sites too.)
// Implementations, one file each: Megatron-core DDP (ddp.cc), Megatron-FSDP (megatron_fsdp.cc),
// PyTorch DistributedDataParallel (torch_ddp.cc), DeepSpeed ZeRO-1 / ZeRO-2 (deepspeed_zero.cc),
// PyTorch FSDP2 fully_shard (fsdp2.cc), DeepSpeed ZeRO-3 (deepspeed_zero3.cc) and no wrapper on
// one device (single_device.cc). They do not include each other; NewDataParallel picks one from
// the Setup's config::DataParallelWrapper.
//
// Hooks emit through the Emitter they are given and must not change the emitter's context.
// Sizes in bytes, counts in elements.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/setup.h"
#include "workload/emitter.h"
#include "workload/kernels.h"
#include "workload/model.h"

namespace memsim::workload {

// Where in a backward pass a group of parameters gets its gradients: the head (final norm,
// output layer; a tied embedding on one stage), one transformer layer, the input embedding.
enum class GradSite { kHead, kLayer, kEmbedding };

// The parameters of one rank and the facts every wrapper needs about them.
struct RankParams {
  std::vector<ParamTensor> params;       // construction order (StageParams)
  std::vector<std::vector<int>> groups;  // optimizer param groups (ParamGroups)
  bool OnSite(int param, GradSite site, int layer, const ModelDims& d) const;
  // Every parameter whole, in param-group order: the slices of an unsharded optimizer.
  std::vector<ShardSlice> Whole() const;
};

// Static sizes of the steady state held by the wrapper (the optimizer adds its state).
struct WrapperSizes {
  Bytes parameter_bytes = 0;   // model parameters (the padded buffer where params live in one)
  Bytes gradient_bytes = 0;    // gradient buffers or .grad tensors
  Bytes main_param_bytes = 0;  // fp32 main weights the wrapper holds (Megatron-FSDP); 0 else
  // Host memory the wrapper keeps (DeepSpeed's offload_optimizer), page-locked or pageable; the
  // optimizer state of HostOptimizerSlices() is added by the caller (build.cc).
  Bytes host_pinned_bytes = 0;
  Bytes host_pageable_bytes = 0;
  bool host_buffers_pinned = false;  // beyond the fp32 partition (offload_optimizer.pin_memory)
  // The optimizer steps fp32 gradients the wrapper holds (FSDP2's sharded grads): no fp32
  // copies of 16-bit gradients at the step (StaticSizes::main_grad_copy_bytes 0).
  bool fp32_optimizer_grads = false;
  // What the pinned and the pageable host bytes hold, in words, where the wrapper says it
  // itself (DeepSpeed ZeRO-3); empty: ZeRO-1 / ZeRO-2's offload_optimizer (the report's own text).
  std::string host_pinned_what;
  std::string host_pageable_what;
};

class DataParallel : public GradSink {
 public:
  ~DataParallel() override = default;

  // How params[i] is on the device once the model is built, `whole` its full storage in the
  // model's dtype: `kept` bytes stay (0: none, DeepSpeed ZeRO-3 with offload_param). With
  // `whole_first` the whole tensor is made first and freed once the part is kept (DeepSpeed
  // ZeRO-3's zero.Init: _post_init_method after each module's __init__); without it the part is
  // made on its own (FSDP2 under torchtitan's meta-device initialisation, fsdp2.cc).
  struct ConstructedParam {
    Bytes kept = 0;
    bool whole_first = false;
  };
  virtual ConstructedParam Constructed(int /*param*/, Bytes whole) const { return {whole, false}; }
  // After the model's parameters exist (param_ids[i] holds params[i], or 0 when Constructed left
  // none of it on the device): the wrapper's buffers.
  virtual void Setup(Emitter& em, const std::vector<TensorId>& param_ids) = 0;
  // Whether the wrapper holds the fp32 main weights itself (else the optimizer clones them).
  virtual bool HoldsMainParams() const { return false; }
  // The slices of each parameter this rank's optimizer updates, in param-group order: the
  // whole parameter, or its shard of a bucket (distributed optimizer).
  virtual std::vector<ShardSlice> OptimizerSlices() const = 0;
  // The slices whose optimizer runs on the host (DeepSpeed offload_optimizer cpu): their state
  // lives in host memory, none of it on the device. Empty by default.
  virtual std::vector<ShardSlice> HostOptimizerSlices() const { return {}; }
  // Whether the optimizer state is sharded over the data-parallel group (it then reduces the
  // grad norm over tp·dp·cp rather than over the model-parallel group).
  virtual bool ShardsOptimizer() const = 0;

  // GradSink: a gradient handed to autograd (AccumulateGrad and the wrapper's hook).
  void TakeParamGrad(Emitter& em, TensorId grad, const std::string& param) override = 0;
  // Around the forward of one site (the embedding, a layer, the head), as module forward
  // pre/post hooks would see it (the place where a sharding wrapper gathers and releases
  // parameters). Full recompute calls them again around each layer it re-runs in backward,
  // before that layer's BeforeBackward (torch.utils.checkpoint re-runs the module, hooks
  // included); there em.phase() is Phase::kBackward.
  virtual void BeforeForward(Emitter& /*em*/, GradSite /*site*/, int /*layer*/) {}
  virtual void AfterForward(Emitter& /*em*/, GradSite /*site*/, int /*layer*/) {}
  // Around the backward of one gradient site (GradSite; `layer` for kLayer).
  virtual void BeforeBackward(Emitter& /*em*/, GradSite /*site*/, int /*layer*/) {}
  virtual void AfterBackward(Emitter& /*em*/, GradSite /*site*/, int /*layer*/) {}
  // After each backward_step's autograd run.
  virtual void EndOfBackward(Emitter& /*em*/) {}
  // After the last micro-batch's backward of model chunk `chunk` in an iteration.
  virtual void AfterLastBackward(Emitter& /*em*/, int /*chunk*/) {}
  // The grad sync finalize_model_grads waits for (finish_grad_sync), for what the backward
  // hooks did not already start.
  virtual void FinishGradSync(Emitter& /*em*/) {}
  // Inside optimizer.zero_grad / the wrapper's zero_grad_buffer at the start of an iteration.
  virtual void ZeroGrad(Emitter& /*em*/) {}
  // Before a plain PyTorch loop's optimizer.step() (training_loop.h PyTorchLoop), where a
  // wrapper that steps its own partition prepares its gradients (DeepSpeed ZeRO); `skipped`: the
  // step found an inf/nan and updates nothing.
  virtual void BeforeOptimizerStep(Emitter& /*em*/, bool /*skipped*/) {}
  // After the optimizer updated the main parameters (e.g. the parameter all-gather).
  virtual void AfterOptimizerStep(Emitter& /*em*/) {}

  virtual WrapperSizes StaticSizes() const = 0;
};

// The wrapper setup.training describes (config::DataParallelOf), for pipeline rank `rank`.
// REQUIRES: a validated Setup; `params` outlives the wrapper.
std::unique_ptr<DataParallel> NewDataParallel(const config::Setup& setup, int rank,
                                              const ModelDims& d, const RankParams& params);

// The wrappers' constructors (ddp.cc, megatron_fsdp.cc, single_device.cc, torch_ddp.cc,
// deepspeed_zero.cc, fsdp2.cc).
std::unique_ptr<DataParallel> NewMegatronDdp(const config::Setup& setup, int rank,
                                             const ModelDims& d, const RankParams& params,
                                             const config::MegatronDdp& ddp);
std::unique_ptr<DataParallel> NewMegatronFsdp(const config::Setup& setup, int rank,
                                              const ModelDims& d, const RankParams& params,
                                              const config::MegatronFsdp& fsdp);
std::unique_ptr<DataParallel> NewSingleDevice(const ModelDims& d, const RankParams& params,
                                              const config::SingleDevice& single);
std::unique_ptr<DataParallel> NewTorchDdp(const ModelDims& d, const RankParams& params,
                                          const config::TorchDdp& ddp);
// Stage 1 or 2; stage 3 goes to NewDeepSpeedZero3.
std::unique_ptr<DataParallel> NewDeepSpeedZero(const ModelDims& d, const RankParams& params,
                                               const config::DeepSpeedZero& zero);
std::unique_ptr<DataParallel> NewTorchFsdp2(const ModelDims& d, const RankParams& params,
                                            const config::TorchFsdp2& fsdp);
std::unique_ptr<DataParallel> NewDeepSpeedZero3(const ModelDims& d, const RankParams& params,
                                                const config::DeepSpeedZero& zero);

// The all-gather of every bucket of `buffers` into the parameters, in place, on the
// communication stream (a sharded optimizer's updated shards; Megatron-core
// DistributedOptimizer / Megatron-FSDP after the step). Nothing with one data-parallel rank.
void ParamAllGather(Emitter& em, const ModelDims& d, const std::vector<GradBuffer>& buffers);

// The buffer layout of a Megatron wrapper (model.h GradBuffer): DDP's or Megatron-FSDP's.
std::vector<GradBuffer> LayoutDdpBuffers(const config::Setup& setup, int rank, const ModelDims& d,
                                         const std::vector<ParamTensor>& params,
                                         bool distributed_optimizer);
std::vector<GradBuffer> LayoutFsdpBuffers(const config::Setup& setup, int rank, const ModelDims& d,
                                          const std::vector<ParamTensor>& params, bool sharded);

}  // namespace memsim::workload
