#!/usr/bin/env python3
"""Write src/config/megatron_flag_table.inc, memsim's class for every flag of
tools/megatron_flags/flags.txt (docs/config.md, "Megatron arguments"):

    tools/megatron_flags/make_table.py > src/config/megatron_flag_table.inc

The classes: modelled (memsim reads the flag; the list below must equal the translator's table in
src/config/megatron_args.cc, which tests/config/megatron_flags_test.cc checks), unsupported (a
feature that changes memory too much to ignore), not modelled (a warning naming the flag and what
it may change), memory-neutral (accepted; listed under --verbose). Every flag gets exactly one
class: the explicit lists first, then the keyword rules in order, then "not modelled" -- the safe
default, since it warns. To reclassify a flag, add it to a list here and rerun; edit the .inc by
hand only through this script.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Read by src/config/megatron_args.cc (kModelled there).
MODELLED = """
--seq-length --micro-batch-size --global-batch-size --tensor-model-parallel-size
--pipeline-model-parallel-size --context-parallel-size --num-layers-per-virtual-pipeline-stage
--num-virtual-stages-per-pipeline-rank --sequence-parallel --fp16 --bf16
--accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16 --main-grads-dtype --optimizer
--weight-decay --sgd-momentum --use-distributed-optimizer --overlap-grad-reduce
--overlap-param-gather --recompute-granularity --recompute-method --recompute-num-layers
--recompute-modules --recompute-activations --use-flash-attn --attention-backend
--transformer-impl --no-gradient-accumulation-fusion --no-create-attention-mask-in-dataloader --train-iters --train-samples
--empty-unused-memory-level --num-layers --hidden-size --ffn-hidden-size --num-attention-heads
--group-query-attention --num-query-groups --kv-channels --max-position-embeddings --vocab-size
--padded-vocab-size --make-vocab-size-divisible-by --swiglu --normalization --disable-bias-linear
--add-qkv-bias --qk-layernorm --position-embedding-type --untie-embeddings-and-output-weights
--hidden-dropout --attention-dropout --use-megatron-fsdp --data-parallel-sharding-strategy
--load --no-load-optim --finetune --expert-model-parallel-size --expert-tensor-parallel-size
--num-experts --fp8-format --enable-cuda-graph --cuda-graph-impl --no-position-embedding
--moe-router-topk --moe-ffn-hidden-size --moe-shared-expert-intermediate-size --moe-layer-freq
--moe-token-dispatcher-type --moe-aux-loss-coeff --moe-permute-fusion --moe-expert-capacity-factor
--moe-pad-expert-input-to-capacity --moe-grouped-gemm --moe-router-pre-softmax
--use-precision-aware-optimizer --main-params-dtype --exp-avg-dtype --exp-avg-sq-dtype
--first-k-dense-replace --n-shared-experts --shared-expert-gate --moe-shared-expert-gate
""".split()

# Accepted without effect on memory, by name (flags common in published launch scripts).
NEUTRAL = """
--use-mcore-models --use-legacy-models --mock-data --num-workers --no-masked-softmax-fusion
--attention-softmax-in-fp32 --init-method-std --norm-epsilon --rotary-base --rotary-percent
--rope-scaling-factor --no-rope-fusion --use-rotary-position-embeddings --distributed-backend
--manual-gc --manual-gc-interval --no-create-attention-mask-in-dataloader --initial-loss-scale
--loss-scale --loss-scale-window --hysteresis --min-loss-scale --no-check-for-nan-in-loss-and-grad
--check-for-nan-in-loss-and-grad --use-fused-rotary-pos-emb --use-rotary-position-embeddings
--no-shared-storage --use-fused-ring-attention-update --position-embedding-type
--cross-entropy-loss-fusion --use-distributed-optimizer
--moe-router-load-balancing-type --moe-per-layer-logging --moe-router-topk-scaling-factor
--norm-topk-prob --moe-router-enable-expert-bias --moe-router-bias-update-rate
""".split()

# Not modelled, with what memsim's answer then is (MindSpeed features: mindspeed/features_manager/).
NOT_MODELLED = {
    "--reuse-fp32-param": "MindSpeed's fp32 main parameters sharing storage with the bf16 ones "
                          "(mindspeed/core/memory/reuse_param/adaptor.py, "
                          "reuse_fp32_param_distrib_optimizer_init): memsim's estimate is high "
                          "by up to 2 bytes per parameter after setup",
    "--swap-attention": "MindSpeed's swap of attention activations to host memory "
                        "(mindspeed/core/memory/swap_attention/swap_attention_apply.py): memsim's "
                        "estimate is high by up to the attention activations each layer keeps",
    "--use-fused-rmsnorm": "MindSpeed's fused RMSNorm kernel (mindspeed/core/fusions/"
                           "fused_rms_norm.py): it changes one norm's temporaries",
    "--use-fused-swiglu": "MindSpeed's fused SwiGLU kernel (mindspeed/core/fusions/"
                          "fused_bias_swiglu.py): it changes one MLP's temporaries",
    "--recompute-activation-function": "MindSpeed's activation-function recompute "
                                       "(mindspeed/core/memory/recompute/activation/): memsim's "
                                       "estimate is high by the MLP activation's output",
    "--moe-z-loss-coeff": "the router's z-loss: memsim omits its saved logits ([tokens, experts] "
                          "per MoE layer)",
    "--moe-router-dtype": "the router's fp32/fp64 logits: memsim keeps them in the activation "
                          "dtype ([tokens, experts] per MoE layer)",
    "--moe-router-score-function": "the router's score function: memsim models softmax "
                                   "(sigmoid saves [tokens, experts] fp32 scores instead)",
    "--moe-shared-expert-overlap": "the shared experts overlapped with the dispatch: memsim runs "
                                   "them before the router",
    "--moe-input-jitter-eps": "router input jitter: one [tokens, hidden] copy per MoE layer",
    "--moe-token-drop-policy": "which tokens a capacity factor drops: no effect on sizes",
}

# Inference-only flags (text generation servers, RL rollouts' inference engine): they do not act
# in a training run, so a keyword below (cuda-graph, moe, mamba) must not make them unsupported.
INFERENCE_ONLY = r"^--(no-|disable-)?(inference-|decode-only-)"

UNSUPPORTED = [
    (r"dsa-indexer|(^|-)index-(topk|skip|share)|moba", "a sparse-attention indexer (DSA, MoBA)"),
    (r"moe|expert|num-experts|router|topk|shared-expert|deepep|grouped-gemm|token-dispatcher",
     "mixture of experts (not modelled yet)"),
    (r"fp8|fp4|fp6|mxfp|nvfp|quantiz", "low-precision (FP8/FP4) training"),
    (r"cuda-graph|cuda_graph|graph-capture|external-cuda-graph", "CUDA graphs"),
    (r"mtp|multi-token", "multi-token prediction layers"),
    (r"mamba|hybrid|ssm|gdn|linear-attention", "state-space / hybrid layers"),
    (r"mla|kv-lora|q-lora|qk-rope|qk-nope|qk-pos-emb|v-head-dim", "multi-latent attention"),
    (r"lora|qlora|adapter", "parameter-efficient fine-tuning (LoRA)"),
    (r"offload|swap|cpu-optim|host-", "offloading tensors to host memory"),
    (r"adaptive-recompute|recompute-in-|recompute-norm|recompute-activation-function|"
     r"recompute-module-list|recompute-type|recompute-mla", "a recompute policy memsim does not model"),
    (r"retro|vision|image|multimodal|(^|-)(vit|t5|bert|dpo|ppo|grpo|rlhf|orm|prm|reward)(-|$)|"
     r"^encoder-",
     "a model or training mode other than dense decoder pretraining"),
    (r"torch-fsdp2|use-custom-fsdp|fsdp2|layerzero|zero3|reuse-fp32-param|"
     r"optimizer-cpu|hetero|megatron-fsdp-main-params",
     "a parameter / optimizer-state layout memsim does not model"),
    (r"dualpipe|schedules-method|noop-layers|pipeline-model-parallel-layout|"
     r"decoder-first-pipeline|decoder-last-pipeline|account-for|num-layer-list|"
     r"pipeline-num-transformer|variable-seq", "an uneven or custom pipeline layout"),
]

NEUTRAL_RULES = [
    r"^--(no-|disable-)?(log|tensorboard|wandb|timing|timer|profile|profiling|nsys|memory-snapshot|"
    r"record-memory|straggler|one-logger|logging)",
    r"^--(no-|disable-)?(save|ckpt|dist-ckpt|checkpoint|load-|non-persistent|async-save|"
    r"auto-detect-ckpt|use-checkpoint|pretrained|use-persistent|exit|finetune-)",
    r"^--(lr|min-lr|override-opt|use-checkpoint-opt|start-weight-decay|end-weight-decay|"
    r"weight-decay-incr|adam-|sgd-|clip-grad|loss-scale|initial-loss|hysteresis|min-loss)",
    r"^--(no-|disable-)?(data|split|train-data|valid-data|test-data|mock|tokenizer|vocab-file|"
    r"merge-file|dataset|num-dataset|mmap|dataloader|reset-|eod|prompt|shuffle|blend|"
    r"per-split|object-storage|s3|msc|sft|is-instruction|handler|output-prefix|input|json-keys|"
    r"append-eod|workers|chunk|cache|full-shuffle|no-shuffle|pad-to|seq-pad|padded-samples|"
    r"packing|pack|neat-pack|stage)",
    r"^--(no-|disable-)?(eval|test-|skip-train|full-validation|multiple-validation)",
    r"^--(no-|disable-)?(seed|data-parallel-random|deterministic|inference-rng|te-rng|"
    r"use-cpu-initialization|init-method|no-initialization|perform-initialization)",
    r"^--(no-|disable-)?(distributed-timeout|distributed-backend|master|local-rank|rank|world|"
    r"nccl|hccl|gloo|use-ring-exchange|enable-gloo|timeout|ft-|fault|rerun|result-rejected|"
    r"error-injection|inprocess|heartbeat|kill|async-)",
    r"^--(no-|disable-)?(rotary|rope|norm-epsilon|layernorm-epsilon|apply-layernorm-1p|"
    r"apply-residual-connection|openai-gelu|squared-relu|onnx|bert-|init-|attention-softmax|"
    r"apply-query-key-layer-scaling|kv-head-repeat|use-fused-rotary|yarn|original-max|"
    r"beta-fast|beta-slow|mscale|long-factor|short-factor|dynamic-factor)",
    r"^--(no-|disable-)?(iter-per-epoch|train-iters-per|exit-|calculate-per-token|"
    r"use-tp-pp-dp-mapping|tp-comm|no-overlap-p2p|overlap-p2p|batch-p2p|ddp-bucket-size|"
    r"bucket-size|ddp-average|scatter-gather|defer-embedding|check-weight-hash|"
    r"manual-gc|use-legacy|use-mcore|spec|yaml|config|model-name|model-type|hf-|"
    r"trust-remote|load-hf|save-hf|num-workers|no-create-attention-mask|create-attention)",
]

NOT_MODELLED_RULES = [
    (r"fusion|fused|fuse", "a kernel fusion: it changes the lifetime of one operation's "
     "temporaries (within a layer)"),
    (r"context-parallel|cp-|ulysses|ring-attention|kv-block|sparse|window|sliding|"
     r"attention-mask|alibi|use-flash|flash", "an attention variant: it may change the "
     "attention activations"),
    (r"overlap|bucket|align|pad|comm|p2p|nccl|hccl|ub-|tp-comm|sharp|scatter|gather|reduce",
     "communication overlap or buffers: it may change communicator and bucket buffers"),
    (r"recompute|checkpoint-activations|distribute-saved", "a recompute variant: it changes "
     "which activations are saved"),
    (r"dtype|precision|fp32|bf16|fp16|half|accumul", "a dtype choice: it may change "
     "the bytes of some buffers"),
]

DEFAULT_WHY = "not modelled: it may change memory by an amount memsim does not estimate"


def classify(flag):
    if flag in MODELLED:
        return "kModelled", ""
    if flag in NEUTRAL:
        return "kNeutral", ""
    if flag in NOT_MODELLED:
        return "kNotModelled", NOT_MODELLED[flag]
    body = flag[2:]
    if re.search(INFERENCE_ONLY, flag):
        return "kNeutral", ""
    for pattern, why in UNSUPPORTED:
        if re.search(pattern, body):
            return "kUnsupported", why
    for pattern in NEUTRAL_RULES:
        if re.search(pattern, flag):
            return "kNeutral", ""
    for pattern, why in NOT_MODELLED_RULES:
        if re.search(pattern, body):
            return "kNotModelled", why
    return "kNotModelled", DEFAULT_WHY


def main():
    flags = {}
    with open(os.path.join(HERE, "flags.txt")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            source, flag = line.split()
            flags.setdefault(flag, []).append(source)
    print("// Generated by tools/megatron_flags/make_table.py from tools/megatron_flags/flags.txt;")
    print("// do not edit by hand. One row per flag: {flag, class, why (for warnings), sources}.")
    for flag in sorted(flags):
        cls, why = classify(flag)
        print(f'{{"{flag}", FlagClass::{cls}, "{why}", "{"+".join(flags[flag])}"}},')


if __name__ == "__main__":
    sys.exit(main())
