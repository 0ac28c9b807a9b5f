#include "workload/pipeline.h"

#include <fmt/format.h>

#include "core/check.h"

namespace memsim::workload {

PipelineExchange::PipelineExchange(Emitter& em, const ModelDims& d)
    : em_(em), d_(d), chunk_input_(d.v, 0), chunk_input_grad_(d.v, 0) {}

TensorId PipelineExchange::AllocRecv(const char* label) {
  em_.Begin(fmt::format("p2p.alloc_{}", label));
  return em_.Alloc(d_.act_bytes * d_.T * d_.h / d_.sigma, Category::kCommunication,
                   fmt::format("p2p.{}", label));
}

void PipelineExchange::P2P(std::string_view name, TensorId send, TensorId recv) {
  em_.Begin(name, -1, kCommStream);
  double bytes = 0;
  for (TensorId id : {send, recv}) {
    if (id == 0) continue;
    em_.RecordStream(id, kCommStream);
    bytes += static_cast<double>(em_.SizeOf(id));
  }
  em_.Collective(CommGroup::kPp, d_.p, bytes, Coll::kP2P);
  if (recv != 0) {
    em_.Begin("p2p.wait");
    em_.Synchronize();
  }
}

void PipelineExchange::SetChunkInput(int chunk, TensorId x) {
  const TensorId old = chunk_input_[chunk], old_grad = chunk_input_grad_[chunk];
  chunk_input_[chunk] = x;
  chunk_input_grad_[chunk] = 0;
  em_.Ref(x);
  // The old input is freed here only once its own backward has run (the chunk is its last
  // holder): the first forward of each chunk in an iteration.
  if (old != 0 && em_.Refs(old) == 1) em_.Begin("p2p.set_input_tensor");
  em_.Unref(old);
  em_.Unref(old_grad);
}

TensorId PipelineExchange::ReceiveForward(int chunk) {
  TensorId x = pending_forward_;
  pending_forward_ = 0;
  if (x == 0) {
    x = AllocRecv("recv_forward");
    P2P("p2p.recv_forward", 0, x);
  }
  SetChunkInput(chunk, x);
  em_.Ref(x);  // this micro-batch's reference (input_tensors), dropped at its backward
  return x;
}

void PipelineExchange::SendForward(TensorId x, bool recv_backward_next) {
  if (recv_backward_next) {
    pending_backward_ = AllocRecv("recv_backward");
    P2P("p2p.send_forward_recv_backward", x, pending_backward_);
    em_.Free(held_recv_backward_);  // the previous output_tensor_grad binding
    held_recv_backward_ = 0;
  } else {
    P2P("p2p.send_forward", x, 0);
  }
  em_.Begin("p2p.deallocate_output");
  em_.Free(x);
}

TensorId PipelineExchange::ReceiveBackward() {
  TensorId dy = pending_backward_;
  pending_backward_ = 0;
  if (dy == 0) {
    dy = AllocRecv("recv_backward");
    P2P("p2p.recv_backward", 0, dy);
    em_.Free(held_recv_backward_);
    held_recv_backward_ = 0;
  }
  return dy;
}

void PipelineExchange::AfterBackwardStep(TensorId recv_grad) {
  em_.Unref(held_input_grad_);
  held_input_grad_ = 0;
  if (recv_grad != 0) {
    MEMSIM_CHECK(held_recv_backward_ == 0);  // dropped at this backward's receive
    held_recv_backward_ = recv_grad;  // output_tensor_grad stays bound until the next receive
  }
}

void PipelineExchange::SendBackward(int chunk, TensorId stage_input, TensorId dx,
                                    bool recv_forward_next) {
  if (recv_forward_next) {
    pending_forward_ = AllocRecv("recv_forward");
    P2P("p2p.send_backward_recv_forward", dx, pending_forward_);
  } else {
    P2P("p2p.send_backward", dx, 0);
    em_.Begin("p2p.release_input");
  }
  // backward_step's retain_grad leaves the grad on the input as .grad: it lives as long as the
  // input, which the model chunk still holds if this was its latest forward.
  if (chunk_input_[chunk] == stage_input) {
    MEMSIM_CHECK(chunk_input_grad_[chunk] == 0);
    chunk_input_grad_[chunk] = dx;
    em_.Ref(dx);
  }
  em_.Unref(stage_input);
  held_input_grad_ = dx;
  em_.Ref(dx);
}

void PipelineExchange::ScheduleReturn() {
  // Only the chunk inputs and their grads (at most two per chunk) outlive the schedule loop,
  // besides the locals dropped here.
  MEMSIM_CHECK(em_.ReferencedTensors() <= 2 * chunk_input_.size() + 1);
  const bool frees_held =
      held_recv_backward_ != 0 || (held_input_grad_ != 0 && em_.Refs(held_input_grad_) == 1);
  if (frees_held) em_.Begin("p2p.schedule_return");
  em_.Free(held_recv_backward_);
  em_.Unref(held_input_grad_);
  held_recv_backward_ = held_input_grad_ = 0;
}

}  // namespace memsim::workload
