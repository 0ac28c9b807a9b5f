#!/bin/bash
# A 13B Llama-2-shaped model on one node of eight NPUs with MindSpeed's memory features
# (--reuse-fp32-param, --swap-attention, --recompute-activation-function), written for memsim's
# tests with the constructs of MindSpeed-LLM's scripts: `python -m torch.distributed.run`, option
# values joined by '=', ${VAR:-default}, a source line memsim does not follow, argument groups as
# strings, output redirected with nohup.
source /usr/local/Ascend/ascend-toolkit/set_env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1

NPUS_PER_NODE=${NPUS_PER_NODE:-8}
NNODES=1
SEQ=${SEQ:-4096}
MBS=2
GBS=256

DISTRIBUTED_ARGS="--nproc_per_node=$NPUS_PER_NODE --nnodes=$NNODES --master_port=6000"

MEMORY_ARGS="
    --reuse-fp32-param \
    --swap-attention \
    --recompute-activation-function \
    --use-fused-rmsnorm \
    --use-fused-swiglu \
    --use-flash-attn
"

GPT_ARGS="
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 1 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --num-layers 40 \
    --hidden-size 5120 \
    --ffn-hidden-size 13824 \
    --num-attention-heads 40 \
    --seq-length ${SEQ} \
    --max-position-embeddings ${SEQ} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --make-vocab-size-divisible-by 1 \
    --vocab-size 32000 \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --bf16 \
    --train-iters 3 \
    --lr 1.0e-6 \
    --weight-decay 0.1
"

nohup python -m torch.distributed.run $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $MEMORY_ARGS \
    --data-path ./dataset/llama_text_document \
    --tokenizer-type Llama2Tokenizer \
    --tokenizer-model ./tokenizer.model \
    --log-interval 1 > train_13b.log 2>&1 &
