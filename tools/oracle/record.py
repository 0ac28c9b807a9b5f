#!/usr/bin/python3
"""The oracle recorder: runs one training step (forward, backward, optimizer step) of real
modelling code on CPU under PyTorch 1.13 and logs the bytes of CPU tensor storage alive at each
module boundary, counted exactly by the allocator wrapper alloc_log.cpp (every storage allocation
and free goes through it).

Usage (README.md): tools/oracle/prepare_sources.sh /tmp/src
  PYTHONPATH=/tmp/src /usr/bin/python3 tools/oracle/record.py CONFIG OUT_DIR
CONFIG: llama, llama_ckpt, llama_lora, llama_qlora, bert, megatron, megatron_moe (or "all").

Writes OUT_DIR/CONFIG.log: '#' header lines (versions, shapes), then one line per boundary,
  <phase> <module> <pre|post> <alive bytes> <peak bytes since the previous line>
phase: fwd (forward with grad), nograd (a checkpointed forward), recompute (the checkpointed
forward re-run inside backward), bwd, step. Backward's pre fires when the gradient of the module's
output is ready (a hook on the output tensor), its post when the gradient of its input is (a hook on
the input tensor, which autograd calls once every use of the input has added its part).
And OUT_DIR/CONFIG.trace: every allocation ("A bytes"), free ("F bytes") and boundary ("M label
alive") in order.
"""
import ctypes
import functools
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_DIR = os.path.dirname(torch.__file__)


def load_counter():
    so = os.path.join(os.environ.get("ORACLE_BUILD", "/tmp"), "memsim_oracle_alloc_log.so")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    subprocess.check_call(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
                           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{TORCH_DIR}/include",
                           os.path.join(HERE, "alloc_log.cpp"), f"-L{TORCH_DIR}/lib", "-lc10",
                           "-o", so])
    lib = ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
    for f in ("oracle_alive", "oracle_peak", "oracle_events"):
        getattr(lib, f).restype = ctypes.c_int64
    lib.oracle_mark.argtypes = [ctypes.c_char_p]
    lib.oracle_trace.argtypes = [ctypes.c_char_p]
    return lib


class Recorder:
    def __init__(self, lib):
        self.lib = lib
        self.lines = []
        self.in_backward = False

    def mark(self, phase, name, where):
        alive, peak = self.lib.oracle_alive(), self.lib.oracle_peak()
        self.lib.oracle_reset_peak()
        label = f"{phase} {name} {where}"
        self.lib.oracle_mark(label.replace(" ", ":").encode())
        self.lines.append(f"{label} {alive} {peak}")

    def forward_phase(self):
        if self.in_backward:
            return "recompute"
        return "fwd" if torch.is_grad_enabled() else "nograd"

    def watch(self, name, module):
        """Forward pre/post hooks on `module`, and backward boundaries through tensor hooks."""
        def first_tensor(x):
            if isinstance(x, torch.Tensor):
                return x
            if isinstance(x, (tuple, list)):
                for y in x:
                    t = first_tensor(y)
                    if t is not None:
                        return t
            if hasattr(x, "to_tuple"):
                return first_tensor(x.to_tuple())
            return None

        def pre(mod, args):
            phase = self.forward_phase()
            self.mark(phase, name, "pre")
            x = first_tensor(args)
            if phase == "fwd" and x is not None and x.requires_grad:
                x.register_hook(lambda g: self.mark("bwd", name, "post"))

        def post(mod, args, out):
            phase = self.forward_phase()
            self.mark(phase, name, "post")
            y = first_tensor(out)
            if phase in ("fwd", "recompute") and y is not None and y.requires_grad:
                y.register_hook(lambda g: self.mark("bwd", name, "pre"))

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def llama_model(variant):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_dropout=0.0, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"  # sdpa needs torch >= 2.1.1
    model = LlamaForCausalLM(cfg)
    if variant == "ckpt":
        model.gradient_checkpointing_enable()  # reentrant (torch.utils.checkpoint default)
    if variant == "qlora":
        return llama_qlora_model(model)
    if variant == "lora":
        from peft import LoraConfig, get_peft_model
        lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj"],
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
    return model


def llama_qlora_model(model):
    """QLoRA as TRL's SFTTrainer and the QLoRA scripts build it: bf16 weights, the decoder's
    linears in 4 bits (emulated: bnb_emulation.py), peft's prepare_model_for_kbit_training (its
    fp32 cast, enable_input_require_grads, gradient_checkpointing_enable: reentrant), then
    get_peft_model with LoRA r 8, alpha 16, dropout 0.1 on q/k/v/o_proj (4-bit base layers get
    peft's lora.bnb.Linear4bit wrapper). The step runs under CPU autocast to bf16 (run_step)."""
    import bnb_emulation
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    model = model.to(torch.bfloat16)
    bnb_emulation.quantize_decoder_linears(model, torch.bfloat16)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, bias="none",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


class _CudaAutocastAsCpu:
    """torch for peft's lora/bnb.py, with is_autocast_enabled() answering for CPU autocast:
    peft asks the CUDA flag (`requires_conversion = not torch.is_autocast_enabled()`), which is
    what a GPU run under autocast answers True to."""

    def __getattr__(self, name):
        if name == "is_autocast_enabled":
            return torch.is_autocast_cpu_enabled
        return getattr(torch, name)


def llama_watch(rec, model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    rec.watch("model", base)
    rec.watch("embed_tokens", inner.embed_tokens)
    for i, layer in enumerate(inner.layers):
        rec.watch(f"layers.{i}", layer)
        rec.watch(f"layers.{i}.input_layernorm", layer.input_layernorm)
        rec.watch(f"layers.{i}.self_attn", layer.self_attn)
        rec.watch(f"layers.{i}.post_attention_layernorm", layer.post_attention_layernorm)
        rec.watch(f"layers.{i}.mlp", layer.mlp)
    rec.watch("norm", inner.norm)
    rec.watch("lm_head", base.lm_head)


def bert_model():
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer
    cfg = BertConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=1,
                     num_attention_heads=4, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=64)
    return BertLayer(cfg)


def step(rec, model, run_forward):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    rec.mark("step", "start", "pre")
    loss = run_forward()
    rec.mark("step", "loss", "post")
    rec.in_backward = True
    loss.backward()
    rec.in_backward = False
    del loss
    rec.mark("step", "backward", "post")
    opt.step()
    rec.mark("step", "optimizer", "post")
    opt.zero_grad(set_to_none=True)
    rec.mark("step", "zero_grad", "post")


def record(config, out_dir, lib):
    torch.manual_seed(0)
    rec = Recorder(lib)
    lib.oracle_trace(os.path.join(out_dir, config + ".trace").encode())
    dtype = "bf16 weights, autocast bf16" if config == "llama_qlora" else "fp32"
    header = [f"torch {torch.__version__}", f"config {config}", f"device cpu, {dtype}, batch 1"]
    if config.startswith("llama"):
        variant = config.split("_")[1] if "_" in config else ""
        if variant == "qlora":
            sys.path.insert(0, HERE)
            import bnb_emulation
            bnb_emulation.install()
        model = llama_model(variant)
        model.train()
        llama_watch(rec, model)
        import transformers
        header.append(f"transformers {transformers.__version__} (0864dd3b), attn eager")
        if variant == "lora":
            import peft
            header.append(f"peft {peft.__version__}: r 8, alpha 16, dropout 0.1, all 7 linears")
        if variant == "qlora":
            import peft
            import peft.tuners.lora.bnb
            peft.tuners.lora.bnb.torch = _CudaAutocastAsCpu()
            header.append(f"peft {peft.__version__}: prepare_model_for_kbit_training, r 8, alpha 16, "
                          "dropout 0.1, q/k/v/o_proj; emulated 4-bit linears (bnb_emulation.py), "
                          "bf16 weights, CPU autocast bf16")
            import bnb_emulation
            header.append(f"quantisation state bytes {bnb_emulation.quantised_state_bytes(model)}")
        header.append("llama h 64 ffn 128 heads 4 kv 2 layers 2 vocab 256 seq 32 untied")
        ids = torch.randint(0, 256, (1, 32))

        def run():
            if variant == "qlora":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return model(input_ids=ids, labels=ids).loss
            return model(input_ids=ids, labels=ids).loss
    elif config == "bert":
        model = bert_model()
        model.train()
        rec.watch("layer", model)
        rec.watch("attention", model.attention)
        rec.watch("intermediate", model.intermediate)
        rec.watch("output", model.output)
        import transformers
        header.append(f"transformers {transformers.__version__} (0864dd3b) BertLayer, eager")
        header.append("bert h 64 ffn 256 heads 4 seq 32 dropout 0.1 (hidden, attention)")
        x = torch.randn(1, 32, 64, requires_grad=True)

        def run():
            return model(x)[0].sum()
    elif config == "megatron":
        sys.path.insert(0, HERE)
        from megatron_layer import MegatronStyleLayer
        model = MegatronStyleLayer(hidden=64, ffn=256, heads=4)
        model.train()
        rec.watch("layer", model)
        for n in ("input_layernorm", "self_attention", "core_attention", "pre_mlp_layernorm", "mlp"):
            rec.watch(n, getattr(model, n) if hasattr(model, n) else getattr(model.self_attention, n))
        header.append("megatron_layer.py (written from Megatron-core TransformerLayer, local spec)")
        header.append("megatron h 64 ffn 256 heads 4 seq 32 [s, b, h], dropout 0.1, unfused attn")
        x = torch.randn(32, 1, 64, requires_grad=True)

        def run():
            return model(x).sum()
    elif config == "megatron_moe":
        sys.path.insert(0, HERE)
        from megatron_moe import MoELayer
        src = next(os.path.join(d, "megatron_core_v0_10", "moe_utils.py") for d in sys.path
                   if os.path.exists(os.path.join(d, "megatron_core_v0_10", "moe_utils.py")))
        model = MoELayer(src, hidden=64, ffn=32, experts=4, topk=2)
        model.train()
        rec.watch("moe", model)
        rec.watch("router", model.router)
        rec.watch("experts", model.experts)
        header.append("megatron_moe.py: core_v0.10.0 moe_utils.py unmodified, MoELayer.forward, "
                      "TopKRouter (no aux loss), alltoall dispatcher at EP 1, SequentialMLP "
                      "re-enacted")
        header.append("megatron_moe h 64 experts 4 top-2 ffn 32 gated silu seq 32 [s, b, h]")
        x = torch.randn(32, 1, 64, requires_grad=True)

        def run():
            return model(x)[0].sum()
    else:
        raise SystemExit(f"unknown config {config}")
    step(rec, model, run)
    lib.oracle_trace_close()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    header.append(f"parameter bytes {params}, trainable {trainable}")
    with open(os.path.join(out_dir, config + ".log"), "w") as f:
        f.write("".join(f"# {h}\n" for h in header))
        f.write("# phase module pre|post alive_bytes peak_bytes_since_previous_line\n")
        f.write("\n".join(rec.lines) + "\n")


def main():
    config, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    lib = load_counter()
    configs = (["llama", "llama_ckpt", "llama_lora", "llama_qlora", "bert", "megatron", "megatron_moe"]
               if config == "all" else [config])
    for c in configs:
        record(c, out_dir, lib)


if __name__ == "__main__":
    main()
