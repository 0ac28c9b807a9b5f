"""A CPU stand-in for the part of bitsandbytes that a QLoRA training step runs, for the oracle
recorder (record.py, config llama_qlora). bitsandbytes needs CUDA, so its 4-bit linear is
emulated here; everything around it (peft's prepare_model_for_kbit_training and LoRA wrapper,
transformers' modelling code, autograd, autocast) is the real code.

What is emulated, from bitsandbytes 0.43.3 (nn/modules.py Linear4bit.forward,
autograd/_functions.py MatMul4Bit), tensor by tensor:
- the weight: a frozen uint8 Parameter of numel / 2 bytes (two 4-bit values a byte, shape
  [numel / 2, 1] as Params4bit packs it) and the quantisation state's fp32 absmax, one per
  64-value block (bnb_4bit_use_double_quant off); a subclass of nn.Linear, as Linear4bit is,
  with the compute_dtype, compress_statistics and quant_type attributes peft reads;
- forward: `inp_dtype = x.dtype`, `x = x.to(self.compute_dtype)`, the product with a transient
  dequantised [out, in] weight in x's dtype, `out.to(inp_dtype)`;
- MatMul4Bit saves only the quantised weight (ctx.tensors = (None, B)), not its input; its
  backward makes the input's gradient from a fresh dequantised weight in the gradient's dtype.
The dequantised values are not NF4's (memory does not depend on them).

install() registers the stand-in as the module `bitsandbytes` (with a module spec, so that
importlib.util.find_spec finds it: peft's is_bnb_available) before peft is imported.
"""
import importlib.machinery
import sys
import types

import torch


def dequantize(packed, shape, dtype):
    """A new [out, in] tensor in `dtype` from the packed bytes (each byte gives two values)."""
    w = torch.empty(shape, dtype=dtype)
    flat = w.view(-1)
    src = packed.view(-1)
    flat[0::2].copy_(src)
    flat[1::2].copy_(src)
    return w.sub_(8).mul_(0.02)


class MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, packed, shape):
        out = torch.nn.functional.linear(A, dequantize(packed, shape, A.dtype))
        ctx.save_for_backward(packed)
        ctx.shape = shape
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (packed,) = ctx.saved_tensors
        grad_a = torch.matmul(grad_output, dequantize(packed, ctx.shape, grad_output.dtype))
        return grad_a, None, None


class Linear4bit(torch.nn.Linear):
    def __init__(self, linear, compute_dtype):
        super().__init__(1, 1, bias=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        numel = self.in_features * self.out_features
        gen = torch.Generator().manual_seed(numel)
        weight = torch.nn.Parameter(
            torch.randint(0, 16, (numel // 2, 1), dtype=torch.uint8, generator=gen),
            requires_grad=False)
        weight.compress_statistics = False
        weight.quant_type = "nf4"
        self.weight = weight
        self.absmax = torch.ones(numel // 64)  # QuantState.absmax (a plain attribute, as in bnb)
        self.compute_dtype = compute_dtype

    def forward(self, x):
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        out = MatMul4Bit.apply(x, self.weight, (self.out_features, self.in_features))
        return out.to(inp_dtype)


class Linear8bitLt(torch.nn.Linear):
    """Never instantiated: peft's isinstance checks name it."""


def install():
    bnb = types.ModuleType("bitsandbytes")
    bnb.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)
    nn = types.ModuleType("bitsandbytes.nn")
    nn.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes.nn", None)
    nn.Linear4bit = Linear4bit
    nn.Linear8bitLt = Linear8bitLt
    nn.Params4bit = torch.nn.Parameter
    nn.Int8Params = torch.nn.Parameter
    bnb.nn = nn
    bnb.functional = types.ModuleType("bitsandbytes.functional")
    bnb.__version__ = "0.43.3-emulated"
    sys.modules["bitsandbytes"] = bnb
    sys.modules["bitsandbytes.nn"] = nn
    sys.modules["bitsandbytes.functional"] = bnb.functional


def quantize_decoder_linears(model, compute_dtype):
    """Replaces every nn.Linear of the decoder layers (not lm_head, as transformers'
    replace_with_bnb_linear keeps it) with the emulated Linear4bit."""
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, Linear4bit(child, compute_dtype))
    model.is_loaded_in_4bit = True


def quantised_state_bytes(model):
    """The absmax tensors, which are not parameters."""
    return sum(m.absmax.numel() * 4 for m in model.modules() if isinstance(m, Linear4bit))
