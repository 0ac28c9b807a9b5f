"""A Megatron-core 0.10 MoE layer on one CPU rank (EP 1, TP 1), for the oracle recorder.

moe_utils.py of core_v0.10.0 (megatron/core/transformer/moe/moe_utils.py) runs unmodified:
topk_softmax_with_capacity (the router's top-k), permute, unpermute and sort_chunks_by_idxs.
Its one import of megatron (parallel_state, used only by the aux-loss tracker) is stubbed. The
rest re-enacts core_v0.10.0's Python line by line, without torch.distributed, Transformer Engine
or apex (none of which runs on CPU under torch 1.13):
  moe_layer.py MoELayer.forward / custom_forward: router, token_permutation, experts,
    token_unpermutation (no shared experts, no recompute);
  router.py TopKRouter.forward / gating / routing with moe_router_load_balancing_type "none"
    (no aux loss, no z-loss, no input jitter);
  token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess / token_permutation /
    token_unpermutation on an EP group of one rank, where tensor_parallel/mappings.py
    _AllToAll.forward returns its input (`if world_size == 1: return input`);
  experts.py SequentialMLP.forward (torch.split by tokens_per_expert, one MLP per expert,
    torch.cat), each expert a transformer/mlp.py MLP with gated SiLU (glu: torch.chunk,
    silu(x[0]) * x[1], bias_activation_fusion off) and no biases (torch.nn.functional.linear, as
    the local spec's ColumnParallelLinear / RowParallelLinear compute at TP 1).
The self.* attributes the dispatcher binds stay bound, as in Megatron.
"""
import importlib.util
import sys
import types

import torch
import torch.nn.functional as F


def load_moe_utils(path):
    """core_v0.10.0 moe_utils.py, with `from megatron.core import parallel_state` stubbed."""
    megatron = types.ModuleType("megatron")
    core = types.ModuleType("megatron.core")
    parallel_state = types.ModuleType("megatron.core.parallel_state")
    core.parallel_state = parallel_state
    megatron.core = core
    sys.modules.setdefault("megatron", megatron)
    sys.modules.setdefault("megatron.core", core)
    sys.modules.setdefault("megatron.core.parallel_state", parallel_state)
    spec = importlib.util.spec_from_file_location("megatron_core_v0_10_moe_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Router(torch.nn.Module):
    def __init__(self, mu, hidden, experts, topk):
        super().__init__()
        self.mu, self.experts, self.topk = mu, experts, topk
        self.weight = torch.nn.Parameter(torch.randn(experts, hidden) * 0.02)

    def forward(self, input):
        logits = F.linear(input, self.weight)  # gating
        logits = logits.view(-1, self.experts)
        logits = logits.view(-1, self.experts)  # routing
        scores, routing_map, _ = self.mu.topk_softmax_with_capacity(logits, self.topk)
        return scores, routing_map


class Expert(torch.nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = torch.nn.Parameter(torch.randn(2 * ffn, hidden) * 0.02)
        self.fc2 = torch.nn.Parameter(torch.randn(hidden, ffn) * 0.02)

    def forward(self, hidden_states):
        intermediate_parallel = F.linear(hidden_states, self.fc1)

        def glu(x):
            x = torch.chunk(x, 2, dim=-1)
            return F.silu(x[0]) * x[1]

        intermediate_parallel = glu(intermediate_parallel)
        output = F.linear(intermediate_parallel, self.fc2)
        return output, None


class SequentialMLP(torch.nn.Module):
    def __init__(self, experts, hidden, ffn):
        super().__init__()
        self.local_experts = torch.nn.ModuleList(Expert(hidden, ffn) for _ in range(experts))

    def forward(self, permuted_local_hidden_states, tokens_per_expert):
        tokens_per_expert = tokens_per_expert.tolist()
        tokens_list = torch.split(permuted_local_hidden_states, tokens_per_expert)
        output_local_list = []
        for expert, tokens in zip(self.local_experts, tokens_list):
            output, _ = expert(tokens)
            output_local_list.append(output)
        output_local = torch.cat(output_local_list, dim=0)
        return output_local, None


class AlltoAllDispatcher:
    """MoEAlltoAllTokenDispatcher (core_v0.10.0), EP 1 and TP 1, dropless."""

    def __init__(self, mu, experts, topk):
        self.mu, self.num_experts, self.topk = mu, experts, topk
        self.num_local_experts = experts
        input_chunk_idxs = torch.arange(self.num_experts)
        self.sort_input_by_local_experts = (
            input_chunk_idxs.reshape(-1, self.num_local_experts).T.ravel().tolist())
        self.restore_output_by_local_experts = (
            input_chunk_idxs.reshape(self.num_local_experts, -1).T.ravel().tolist())

    def preprocess(self, routing_map):
        num_local_tokens_per_expert = routing_map.sum(dim=0).long()
        self.num_out_tokens = routing_map.size(0) * self.topk
        num_global_tokens_per_local_expert = num_local_tokens_per_expert.reshape(self.num_experts)
        num_tokens_per_local_expert = num_local_tokens_per_expert.to(torch.device("cpu"))
        if self.num_local_experts > 1:
            self.num_global_tokens_per_local_expert_cpu = num_global_tokens_per_local_expert.view(
                -1, self.num_local_experts).to(torch.device("cpu"))
        return num_tokens_per_local_expert

    def token_permutation(self, hidden_states, probs, routing_map):
        self.hidden_shape = hidden_states.shape
        self.probs = probs
        self.routing_map = routing_map
        hidden_states = hidden_states.view(-1, self.hidden_shape[-1])
        tokens_per_expert = self.preprocess(self.routing_map)
        self.hidden_shape_before_permute = hidden_states.shape
        permutated_local_input_tokens, self.reversed_local_input_permutation_mapping = (
            self.mu.permute(hidden_states, routing_map, num_out_tokens=self.num_out_tokens))
        global_input_tokens = permutated_local_input_tokens  # all_to_all, one rank
        if self.num_local_experts > 1:
            global_input_tokens = self.mu.sort_chunks_by_idxs(
                global_input_tokens, self.num_global_tokens_per_local_expert_cpu.ravel(),
                self.sort_input_by_local_experts)
        return global_input_tokens, tokens_per_expert

    def token_unpermutation(self, hidden_states, bias=None):
        if self.num_local_experts > 1:
            hidden_states = self.mu.sort_chunks_by_idxs(
                hidden_states, self.num_global_tokens_per_local_expert_cpu.T.ravel(),
                self.restore_output_by_local_experts)
        permutated_local_input_tokens = hidden_states  # all_to_all, one rank
        output = self.mu.unpermute(
            permutated_local_input_tokens, self.reversed_local_input_permutation_mapping,
            restore_shape=self.hidden_shape_before_permute, probs=self.probs,
            routing_map=self.routing_map)
        output = output.view(self.hidden_shape)
        return output, None


class MoELayer(torch.nn.Module):
    def __init__(self, moe_utils_path, hidden=64, ffn=32, experts=4, topk=2):
        super().__init__()
        mu = load_moe_utils(moe_utils_path)
        self.router = Router(mu, hidden, experts, topk)
        self.experts = SequentialMLP(experts, hidden, ffn)
        self.token_dispatcher = AlltoAllDispatcher(mu, experts, topk)

    def forward(self, hidden_states):
        def custom_forward(hidden_states):
            probs, routing_map = self.router(hidden_states)
            (dispatched_input, tokens_per_expert) = self.token_dispatcher.token_permutation(
                hidden_states, probs, routing_map)
            expert_output, mlp_bias = self.experts(dispatched_input, tokens_per_expert)
            output, mlp_bias = self.token_dispatcher.token_unpermutation(expert_output, mlp_bias)
            return output, mlp_bias

        output, mlp_bias = custom_forward(hidden_states)
        return output, mlp_bias
