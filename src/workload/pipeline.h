// Pipeline-parallel point-to-point exchanges of one rank and the lifetimes of their tensors,
// following Megatron-core's 1F1B loops (megatron/core/pipeline_parallel/schedules.py
// forward_backward_pipelining_without_interleaving / _with_interleaving, p2p_communication.py
// _communicate):
// - a received activation or gradient is a new [s/σ, b, h] tensor (torch.empty), recorded on
//   the communication stream (ProcessGroupNCCL), so its free waits for the transfer; a receive
//   is waited for before compute goes on;
// - after a forward followed by a backward, send_forward_recv_backward allocates the grad
//   buffer of that backward before the output is deallocated (deallocate_output_tensor, with
//   deallocate_pipeline_outputs); after a backward followed by a forward,
//   send_backward_recv_forward allocates the next input before the backwarded input is dropped;
// - Python locals keep the previous output_tensor_grad until the next receive of a grad, and
//   the previous input_tensor_grad until the next backward_step returns (the last ones until
//   the schedule function returns, after finalize_model_grads);
// - each model chunk keeps the input of its latest forward (TransformerBlock.set_input_tensor,
//   megatron/core/transformer/transformer_block.py) and the .grad that backward_step's
//   retain_grad left on it, until its next forward: they outlive the iteration.
#pragma once

#include <vector>

#include "workload/emitter.h"
#include "workload/model.h"

namespace memsim::workload {

class PipelineExchange {
 public:
  PipelineExchange(Emitter& em, const ModelDims& d);

  // The input of a forward on a chunk that receives it (received by the previous backward's
  // exchange, or now). The chunk and the micro-batch each take a reference.
  TensorId ReceiveForward(int chunk);
  // After a forward on a chunk that sends its output x: sends it (receiving the next grad in
  // the same exchange when recv_backward_next), then deallocates x.
  void SendForward(TensorId x, bool recv_backward_next);
  // The output grad of a backward on a chunk that receives it.
  TensorId ReceiveBackward();
  // After a backward step: drops the previous input_tensor_grad binding; binds recv_grad (0 if
  // the grad was not received).
  void AfterBackwardStep(TensorId recv_grad);
  // After the backward of a chunk whose input was received: sends the input grad dx (receiving
  // the next input when recv_forward_next), keeps dx as the chunk input's .grad if that input
  // is the chunk's latest, and drops the micro-batch's reference to stage_input.
  void SendBackward(int chunk, TensorId stage_input, TensorId dx, bool recv_forward_next);
  // REQUIRES at the end of an iteration's schedule: nothing received ahead.
  bool Idle() const { return pending_forward_ == 0 && pending_backward_ == 0; }
  // The schedule function returns: its locals go out of scope.
  void ScheduleReturn();

 private:
  TensorId AllocRecv(const char* label);
  void P2P(std::string_view name, TensorId send, TensorId recv);
  void SetChunkInput(int chunk, TensorId x);

  Emitter& em_;
  const ModelDims& d_;
  TensorId pending_forward_ = 0, pending_backward_ = 0;    // received ahead
  TensorId held_recv_backward_ = 0, held_input_grad_ = 0;  // kept by Python locals
  // Per model chunk: the input its TransformerBlock keeps and that input's retained .grad.
  std::vector<TensorId> chunk_input_, chunk_input_grad_;
};

}  // namespace memsim::workload
