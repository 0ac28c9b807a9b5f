"""A minimal Megatron-core style transformer layer for the oracle recorder: one tensor-parallel
rank (TP 1), the "local" spec (no Transformer Engine), unfused attention, [s, b, h] layout,
LayerNorm, GeLU MLP with biases, dropout on the attention probabilities and in both
bias-dropout-adds. Written from Megatron-LM's megatron/core (core_r0.5-era layout):
  transformer/transformer_layer.py  TransformerLayer.forward (residual, input_layernorm,
    self_attention, self_attn_bda, pre_mlp_layernorm, mlp, mlp_bda)
  fusions/fused_bias_dropout.py     _bias_dropout_add_func (x + bias, dropout, residual + out)
  transformer/attention.py          SelfAttention.get_query_key_value_tensors (one linear_qkv,
    the [sq, b, np, 3·hn] view split into q, k, v) and Attention.forward (core_attention,
    linear_proj with skip_bias_add)
  transformer/dot_product_attention.py DotProductAttention.forward (baddbmm into the global
    memory buffer with beta 0 and alpha 1/sqrt(hn), scale_mask_softmax, attention_dropout, bmm,
    permute(2, 0, 1, 3).contiguous())
  fusions/fused_softmax.py          FusedScaleMaskSoftmax.forward_torch_softmax (fp32 input: no
    casts; the causal mask by masked_fill_ in place, utils.attention_mask_func)
  transformer/mlp.py                MLP.forward (linear_fc1 with skip_bias_add, + bias, gelu,
    linear_fc2 with skip_bias_add)
  tensor_parallel/layers.py         LinearWithGradAccumulationAndAsyncCommunication (saves input
    and weight; forward matmul(input, weight.t()) then + bias; backward grad_output.matmul(weight),
    grad_weight from the 2-D views, grad_bias = grad_output.sum(0))
  global_vars / parallel_state      GlobalMemoryBuffer.get_tensor (one buffer per (name, dtype),
    kept for the run and reused by every layer)
"""
import math

import torch
from torch import nn


class _GlobalMemoryBuffer:
    def __init__(self):
        self.buffer = {}

    def get_tensor(self, shape, dtype, name):
        numel = math.prod(shape)
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < numel:
            self.buffer[key] = torch.empty(numel, dtype=dtype, requires_grad=False)
        return self.buffer[key][0:numel].view(*shape)


GLOBAL_MEMORY_BUFFER = _GlobalMemoryBuffer()


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.use_bias = bias is not None
        out = torch.matmul(x, weight.t())
        if bias is not None:
            out = out + bias
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        g2 = grad_output.reshape(-1, grad_output.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        grad_weight = g2.t().matmul(x2)
        grad_bias = g2.sum(dim=0) if ctx.use_bias else None
        return grad_input, grad_weight, grad_bias


class _Linear(nn.Module):
    def __init__(self, n_in, n_out, skip_bias_add):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.skip_bias_add = skip_bias_add

    def forward(self, x):
        if self.skip_bias_add:
            return _LinearFn.apply(x, self.weight, None), self.bias
        return _LinearFn.apply(x, self.weight, self.bias), None


def _bias_dropout_add(x_with_bias, residual, prob, training):
    x, bias = x_with_bias
    if bias is not None:
        x = x + bias
    out = torch.nn.functional.dropout(x, p=prob, training=training)
    return residual + out


class CoreAttention(nn.Module):
    def __init__(self, heads, head_dim, dropout):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm_factor = math.sqrt(head_dim)
        self.attention_dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, attention_mask):
        sq, b, np_, hn = query.shape
        sk = key.shape[0]
        output_size = (b, np_, sq, sk)
        query = query.reshape(sq, b * np_, hn)
        key = key.view(sk, b * np_, hn)
        buf = GLOBAL_MEMORY_BUFFER.get_tensor((b * np_, sq, sk), query.dtype, "mpu")
        matmul_result = torch.baddbmm(buf, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2),
                                      beta=0.0, alpha=1.0 / self.norm_factor)
        attention_scores = matmul_result.view(*output_size)
        attention_scores.masked_fill_(attention_mask, -10000.0)
        attention_probs = torch.nn.Softmax(dim=-1)(attention_scores)
        attention_probs = self.attention_dropout(attention_probs)
        value = value.view(sk, b * np_, hn)
        attention_probs = attention_probs.view(b * np_, sq, sk)
        context = torch.bmm(attention_probs, value.transpose(0, 1))
        context = context.view(b, np_, sq, hn)
        context = context.permute(2, 0, 1, 3).contiguous()
        return context.view(sq, b, np_ * hn)


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.linear_qkv = _Linear(hidden, 3 * hidden, skip_bias_add=False)
        self.core_attention = CoreAttention(heads, self.head_dim, dropout)
        self.linear_proj = _Linear(hidden, hidden, skip_bias_add=True)

    def forward(self, hidden_states, attention_mask):
        mixed_qkv, _ = self.linear_qkv(hidden_states)
        sq, b = mixed_qkv.shape[:2]
        mixed_qkv = mixed_qkv.view(sq, b, self.heads, 3 * self.head_dim)
        query, key, value = torch.split(mixed_qkv, [self.head_dim] * 3, dim=3)
        core_attn_out = self.core_attention(query, key, value, attention_mask)
        return self.linear_proj(core_attn_out)


class MLP(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.linear_fc1 = _Linear(hidden, ffn, skip_bias_add=True)
        self.linear_fc2 = _Linear(ffn, hidden, skip_bias_add=True)

    def forward(self, hidden_states):
        intermediate, bias = self.linear_fc1(hidden_states)
        intermediate = intermediate + bias
        intermediate = torch.nn.functional.gelu(intermediate)
        return self.linear_fc2(intermediate)


class MegatronStyleLayer(nn.Module):
    def __init__(self, hidden, ffn, heads, dropout=0.1):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        self.self_attention = SelfAttention(hidden, heads, dropout)
        self.pre_mlp_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = MLP(hidden, ffn)
        self.hidden_dropout = dropout

    def forward(self, hidden_states):
        s = hidden_states.shape[0]
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        residual = hidden_states
        input_layernorm_output = self.input_layernorm(hidden_states)
        attention_output_with_bias = self.self_attention(input_layernorm_output, mask)
        hidden_states = _bias_dropout_add(attention_output_with_bias, residual,
                                          self.hidden_dropout, self.training)
        residual = hidden_states
        pre_mlp_layernorm_output = self.pre_mlp_layernorm(hidden_states)
        mlp_output_with_bias = self.mlp(pre_mlp_layernorm_output)
        return _bias_dropout_add(mlp_output_with_bias, residual, self.hidden_dropout, self.training)
