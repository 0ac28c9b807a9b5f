// The evaluation pass a Hugging Face Trainer runs inside training (framework "hf-trainer",
// eval_strategy "steps"): after the optimizer step and model.zero_grad() of every eval_steps-th
// step, Trainer._maybe_log_save_evaluate -> evaluate -> evaluation_loop
// (transformers/trainer.py) runs eval_batches batches of per_device_eval_batch_size samples:
// - the model unwrapped (Trainer._wrap_model returns it as is when not training: no
//   DistributedDataParallel hooks, buckets or rebuild) and in eval mode (no dropout);
// - prediction_step's forward under torch.no_grad(): nothing saved for backward, each layer's
//   tensors freed as it goes (LayerModule's nograd forward);
// - with predictions kept (compute_metrics given, prediction_loss_only false), the logits and
//   labels of every batch, gathered across processes (accelerate gather_for_metrics: an
//   all-gather into a new [world_size x b, ...] tensor), concatenated on the device by
//   EvalLoopContainer.add (trainer_pt_utils.py nested_concat -> torch.cat: a new tensor of all
//   batches so far, the old one freed) and moved to the CPU every eval_accumulation_steps batches
//   (EvalLoopContainer.to_cpu_and_numpy, then torch.cuda.empty_cache()) or at the end; the losses
//   (loss.repeat(b), fp32) always.
// The logits kept are fp32 under fp16 / bf16: accelerate's prepare_model wraps the model's own
// forward in autocast and convert_outputs_to_fp32 (accelerate/accelerator.py,
// utils/operations.py convert_to_fp32), which evaluation reaches through the unwrapped model too.
// Not modelled: the data loader's prefetch of the next batch, the bf16 logits alive next to their
// fp32 conversion (the head's own logits are freed before the kept copy is made), use_cache's
// key/value cache of a decoder in eval mode (Transformers builds a DynamicCache unless
// config.use_cache is false), batch_eval_metrics.
#pragma once

#include "config/setup.h"
#include "workload/modules/decoder_layer.h"
#include "workload/modules/module.h"

namespace memsim::workload {

// Whether optimizer step `step` (1-based, the Trainer's global_step after it) is followed by an
// evaluation: DefaultFlowCallback.on_step_end (transformers/trainer_callback.py).
bool EvaluatesAfterStep(const config::TrainingConfig& tc, int step);

// The dimensions of one evaluation batch: the training dims with b = eval_batch_size and no
// dropout (model.eval()).
ModelDims EvalDims(const ModelDims& train, const config::TrainingConfig& tc);

// Emits one evaluation pass. `ctx` carries the evaluation dims (EvalDims) and the training
// run's Kernels, which run with them for the pass. REQUIRES: one pipeline stage (p == 1), v == 1.
void RunEvaluation(ModuleContext& ctx, DecoderLayer& layer, const config::TrainingConfig& tc,
                   const ModelDims& train_dims);

}  // namespace memsim::workload
