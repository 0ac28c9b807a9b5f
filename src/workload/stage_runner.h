// StageRunner: the forward and backward of one unit of the schedule -- one micro-batch through
// one model chunk of this pipeline rank -- as Megatron-core's forward_step / backward_step run
// it (megatron/core/pipeline_parallel/schedules.py): get_batch, the embedding on the first
// stage, the chunk's decoder layers (with full recompute where the policy checkpoints them),
// the output layer and loss on the last stage, and the pipeline exchanges around them. It
// holds the saved tensors of every unit in flight; the data-parallel wrapper's forward hooks run
// around each site's forward (full recompute's re-forward of a layer included), its backward
// hooks around each gradient site's backward.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "workload/data_parallel.h"
#include "workload/modules/decoder_layer.h"
#include "workload/modules/embedding.h"
#include "workload/modules/output_loss.h"
#include "workload/pipeline.h"
#include "workload/recompute.h"
#include "workload/schedule.h"

namespace memsim::workload {

class StageRunner {
 public:
  // All references must outlive the runner.
  StageRunner(ModuleContext& ctx, const config::TrainingConfig& tc, int rank, DecoderLayer& layer,
              DataParallel& dp, PipelineExchange& exchange);

  // The forward / backward of micro-batch mb on model chunk `chunk`; `next` is the schedule's
  // following step (nullptr at its end), which decides the pipeline exchange.
  void Forward(int mb, int chunk, const ScheduleStep* next);
  void Backward(int mb, int chunk, const ScheduleStep* next);
  // No unit in flight.
  bool Idle() const { return units_.empty(); }
  // The loss-reporting tensors made since the last call (kept by the training loop).
  std::vector<TensorId> TakeReportLosses();

 private:
  // One unit (micro-batch, chunk) in flight.
  struct Unit {
    TensorId stage_input = 0;
    bool input_external = false;  // received: owned by the exchange, not by layer 0
    Batch batch;
    EmbeddingSaved embedding;
    std::vector<TensorId> layer_inputs;
    std::vector<DecoderLayer::Saved> layers;
    HeadSaved head;
  };

  int GlobalLayer(int chunk, int i) const;
  bool Pre(int chunk) const;
  bool Post(int chunk) const;
  TensorId LayersForward(Unit& u, int chunk, TensorId x);
  TensorId LayersBackward(Unit& u, int chunk, TensorId dy, bool dy_external);
  void DropBatch(Unit& u);

  ModuleContext& ctx_;
  const ModelDims& d_;
  const int rank_;
  DecoderLayer& layer_;
  DataParallel& dp_;
  PipelineExchange& exchange_;
  const std::vector<LayerRun> runs_;
  std::map<std::pair<int, int>, Unit> units_;  // by (micro-batch, chunk)
  std::vector<TensorId> report_losses_;
};

}  // namespace memsim::workload
