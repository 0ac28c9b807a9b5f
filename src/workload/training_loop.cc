#include "workload/training_loop.h"

#include "core/check.h"
#include "workload/evaluation.h"

namespace memsim::workload {

std::vector<TensorId> TrainingLoop::BuildModel() {
  Emitter& em = p_.em;
  const std::vector<ParamTensor>& params = p_.params.params;
  std::vector<TensorId> ids(params.size(), 0);
  int prev_layer = -2;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& pt = params[i];
    if (pt.layer != prev_layer || i == 0) {
      const char* name = pt.layer >= 0                        ? "init.model.layer"
                         : pt.name.rfind("embedding", 0) == 0 ? "init.model.embedding"
                                                              : "init.model.output";
      em.Begin(name, pt.layer);
      prev_layer = pt.layer;
    }
    const Bytes bytes = pt.storage_bytes > 0 ? pt.storage_bytes : pt.numel * p_.d.param_bytes;
    const DataParallel::ConstructedParam made = p_.dp.Constructed(static_cast<int>(i), bytes);
    if (!made.whole_first || made.kept == bytes) {
      ids[i] = made.kept > 0 ? em.Alloc(made.kept, Category::kParameters, pt.name) : 0;
      continue;
    }
    // Partitioned as it is built: the whole tensor, then the part that stays, then the whole
    // one freed (zero.Init's _post_init_method after each module's __init__).
    const TensorId whole = em.Alloc(bytes, Category::kParameters, pt.name + ".whole");
    ids[i] = made.kept > 0 ? em.Alloc(made.kept, Category::kParameters, pt.name) : 0;
    em.Free(whole);
  }
  return ids;
}

void TrainingLoop::RunSchedule() {
  Emitter& em = p_.em;
  const std::vector<ScheduleStep>& steps = p_.steps;
  std::vector<int> last_backward(p_.d.v, -1);
  if (p_.shapes != nullptr) p_.shapes->BeginIteration();
  for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
    if (!steps[i].forward) last_backward[steps[i].chunk] = i;
  }
  for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
    const ScheduleStep& st = steps[i];
    const ScheduleStep* next = i + 1 < static_cast<int>(steps.size()) ? &steps[i + 1] : nullptr;
    em.SetMicroBatch(st.micro_batch);
    if (p_.shapes != nullptr) p_.shapes->Select(st.micro_batch);
    if (st.forward) {
      em.SetPhase(Phase::kForward);
      p_.runner.Forward(st.micro_batch, st.chunk, next);
    } else {
      em.SetPhase(Phase::kBackward);
      p_.runner.Backward(st.micro_batch, st.chunk, next);
      if (i == last_backward[st.chunk]) p_.dp.AfterLastBackward(em, st.chunk);
    }
  }
  em.SetMicroBatch(-1);
  em.SetPhase(Phase::kBackward);
  if (p_.shapes != nullptr) p_.shapes->EndIteration();
  MEMSIM_CHECK(p_.exchange.Idle() && p_.runner.Idle());
}

namespace {

class MegatronLoop final : public TrainingLoop {
 public:
  explicit MegatronLoop(const LoopParts& parts)
      : TrainingLoop(parts), optimizer_(parts.setup, parts.d, parts.params, parts.dp) {}

  void Init() override {
    Emitter& em = p_.em;
    em.SetContext(0, Phase::kInit, -1);
    // Before the model is built, collectives on the default group create the world's
    // communicator: initialize.py _compile_dependencies (torch.distributed.barrier()) and
    // training.py pretrain (the all-reduce of start_time_tensor), in core_v0.6.0 to main.
    em.Begin("init.distributed");
    em.Collective(CommGroup::kWorld, p_.d.t * p_.d.p * p_.d.dp_cp, 8, Coll::kAllReduce);
    const std::vector<TensorId> ids = BuildModel();
    // LanguageModule.setup_embeddings_and_output_layer: with tied embeddings and p > 1 the
    // first and last stages all-reduce the shared weight over "embd" (in place).
    for (const ParamTensor& pt : p_.params.params) {
      if (!pt.shared_embedding) continue;
      em.Begin("init.model.sync_embedding");
      em.Collective(CommGroup::kEmbd, 2, static_cast<double>(pt.numel * p_.d.param_bytes), Coll::kAllReduce);
    }
    p_.dp.Setup(em, ids);
    optimizer_.Init(em);
  }

  void Iteration(int k) override {
    Emitter& em = p_.em;
    const int level = p_.setup.training.empty_unused_memory_level;
    em.SetContext(k, Phase::kForward, -1);
    // train_step: zero_grad_buffer (a memset) and optimizer.zero_grad.
    em.Begin("zero_grad");
    optimizer_.ZeroGrad(em);
    p_.dp.ZeroGrad(em);
    RunSchedule();
    // forward_backward_func calls finalize_model_grads before it returns, so its locals (the
    // last output_tensor_grad and input_tensor_grad) are alive during it.
    FinalizeModelGrads();
    p_.exchange.ScheduleReturn();
    if (level >= 1) em.EmptyCache();
    em.SetContext(k, Phase::kOptimizerStep, -1);
    optimizer_.Step(em, k <= p_.setup.training.skipped_iterations);
    if (p_.f.params_norm_copies != FrameworkFacts::ParamsNormCopies::kNone) LogParamsNorm();
    em.Begin("optim.done");  // logging; the iteration's loss-reporting tensors dropped
    em.Synchronize();
    for (TensorId id : p_.runner.TakeReportLosses()) em.Free(id);
    if (level >= 2) em.EmptyCache();
  }

 private:
  // finalize_model_grads: the wrapper's grad sync, the sequence-parallel norm grads, the tied
  // embedding grads.
  void FinalizeModelGrads() {
    Emitter& em = p_.em;
    const ModelDims& d = p_.d;
    p_.dp.FinishGradSync(em);
    em.Begin("ddp.finish_grad_sync");
    em.Synchronize();
    if (d.sp) {
      // _allreduce_layernorm_grads: flatten the SP-replicated grads (fp32 main_grad views) into
      // one transient, all-reduce over TP, copy back.
      std::int64_t numel = 0;
      for (const ParamTensor& pt : p_.params.params) numel += pt.sequence_parallel ? pt.numel : 0;
      em.Begin("ddp.allreduce_layernorm_grads");
      const TensorId flat =
          em.Alloc(numel * d.grad_bytes, Category::kTemporaries, "ddp.layernorm_grads_flat");
      em.Collective(CommGroup::kTp, d.t, static_cast<double>(numel * d.grad_bytes), Coll::kAllReduce);
      em.Free(flat);
    }
    for (const ParamTensor& pt : p_.params.params) {
      if (!pt.shared_embedding) continue;
      // _allreduce_word_embedding_grads: first and last stage, group "embd", in place.
      em.Begin("ddp.allreduce_embedding_grads");
      em.Collective(CommGroup::kEmbd, 2, static_cast<double>(pt.numel * d.grad_bytes), Coll::kAllReduce);
    }
  }

  // --log-params-norm (TrainingConfig::log_params_norm): calc_params_l2_norm's fp32 copies,
  // listed together and freed when it returns (megatron/training/utils.py). Under bf16 only
  // (`param.data.float() if args.bf16`); dense parameters use their `main_param` from
  // core_v0.11.0 on (set by optimizer.py / distrib_optimizer.py), experts are always copied. Not
  // counted: the last stage's tied output weight (`shared`, param_is_not_shared); TP duplicates
  // are counted, as on TP rank 0 (param_is_not_tensor_parallel_duplicate).
  void LogParamsNorm() {
    const bool dense_main_param = p_.f.params_norm_copies == FrameworkFacts::ParamsNormCopies::kExperts;
    Emitter& em = p_.em;
    em.Begin("log.params_norm");
    std::vector<TensorId> copies;
    for (const ParamTensor& pt : p_.params.params) {
      if (pt.frozen || (pt.shared_embedding && pt.name.rfind("output_layer", 0) == 0)) continue;
      if (dense_main_param && !pt.expert) continue;
      copies.push_back(em.Alloc(pt.numel * 4, Category::kTemporaries, "log.params_fp32"));
    }
    for (TensorId id : copies) em.Free(id);
  }

  MegatronOptimizer optimizer_;
};

class PyTorchLoop final : public TrainingLoop {
 public:
  explicit PyTorchLoop(const LoopParts& parts)
      : TrainingLoop(parts),
        // torch.optim keeps its state in the parameters' dtype (zeros_like(param)).
        optimizer_(parts.setup.training, parts.params,
                   MainTensors(parts.params, parts.dp.OptimizerSlices()),
                   OptimizerStateLayout(parts.setup, parts.d)) {}

  void Init() override {
    p_.em.SetContext(0, Phase::kInit, -1);
    p_.dp.Setup(p_.em, BuildModel());
  }

  void Iteration(int k) override {
    Emitter& em = p_.em;
    em.SetContext(k, Phase::kForward, -1);
    em.Begin("zero_grad");
    p_.dp.ZeroGrad(em);
    RunSchedule();
    em.SetContext(k, Phase::kOptimizerStep, -1);
    // torch.amp.GradScaler.step calls optimizer.step() only when no inf/nan was found
    // (torch/amp/grad_scaler.py GradScaler._maybe_opt_step).
    const bool skipped = k <= p_.setup.training.skipped_iterations;
    p_.dp.BeforeOptimizerStep(em, skipped);
    if (!skipped) {
      optimizer_.Step(em);
      p_.dp.AfterOptimizerStep(em);
    }
    // The Trainer's model.zero_grad() after the step (FrameworkFacts::zero_grad_after_step),
    // skipped step or not; the zero_grad at the next iteration's start then finds nothing.
    if (p_.f.zero_grad_after_step) {
      em.Begin("zero_grad");
      p_.dp.ZeroGrad(em);
    }
    em.Begin("step_done");  // the loss the loop logged (loss.item()) is dropped
    for (TensorId id : p_.runner.TakeReportLosses()) em.Free(id);
    if (p_.eval_ctx != nullptr && EvaluatesAfterStep(p_.setup.training, k)) Evaluate(k);
  }

 private:
  // Trainer._inner_training_loop: optimizer.step(), model.zero_grad() (done in Iteration, as
  // FrameworkFacts::zero_grad_after_step), then _maybe_log_save_evaluate, so the evaluation
  // runs without .grad (set_to_none).
  void Evaluate(int k) {
    Emitter& em = p_.em;
    if (!p_.f.zero_grad_after_step) {
      em.Begin("zero_grad");
      p_.dp.ZeroGrad(em);
    }
    em.SetContext(k, Phase::kForward, -1);
    RunEvaluation(*p_.eval_ctx, *p_.layer, p_.setup.training, p_.d);
  }

  TorchOptimizer optimizer_;
};

}  // namespace

std::unique_ptr<TrainingLoop> NewMegatronLoop(const LoopParts& parts) {
  return std::make_unique<MegatronLoop>(parts);
}
std::unique_ptr<TrainingLoop> NewPyTorchLoop(const LoopParts& parts) {
  return std::make_unique<PyTorchLoop>(parts);
}

}  // namespace memsim::workload
