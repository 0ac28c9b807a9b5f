#!/bin/bash
# A GPT-3-family model (40 layers, hidden 5120) in fp16 on two nodes of eight GPUs, written for
# memsim's tests with the constructs of Megatron-LM's examples/gpt3 script: positional
# arguments with comments after them, $(( )) over $-variables, tab-indented arrays, a comment
# after an argument, a GPT-2 BPE tokenizer from files (so no vocabulary size in the arguments).

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# set for the cluster
MASTER_ADDR=localhost
MASTER_PORT=29512
NUM_NODES=2
NODE_RANK=0
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CKPT_DIR=$1 # where checkpoints go
TB_DIR=$2 # tensorboard
VOCAB=$3 # gpt2-vocab.json
MERGES=$4 # gpt2-merges.txt
DATA=$5 # data prefix

DISTRIBUTED_ARGS=(
	--nproc_per_node $GPUS_PER_NODE
	--nnodes $NUM_NODES
	--master_addr $MASTER_ADDR
	--master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
	--num-layers 40
	--hidden-size 5120
	--num-attention-heads 40
	--seq-length 2048
	--max-position-embeddings 2048
	--attention-backend auto # flash, fused, unfused or local also work
)

TRAINING_ARGS=(
	--micro-batch-size 1
	--global-batch-size 256
	--train-iters 500000
	--weight-decay 0.1
	--adam-beta1 0.9
	--adam-beta2 0.95
	--init-method-std 0.008
	--clip-grad 1.0
	--fp16
	--lr 1.0e-4
	--lr-decay-style cosine
	--min-lr 1.0e-5
	--lr-warmup-fraction .01
	--lr-decay-iters 430000
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 4
	--pipeline-model-parallel-size 2
)

DATA_ARGS=(
	--data-path $DATA
	--vocab-file $VOCAB
	--merge-file $MERGES
	--split 969,30,1
)

EVAL_AND_LOGGING_ARGS=(
	--log-interval 10
	--save-interval 5000
	--eval-interval 1000
	--save $CKPT_DIR
	--load $CKPT_DIR
	--eval-iters 10
	--tensorboard-dir $TB_DIR
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
	${GPT_MODEL_ARGS[@]} \
	${TRAINING_ARGS[@]} \
	${MODEL_PARALLEL_ARGS[@]} \
	${DATA_ARGS[@]} \
	${EVAL_AND_LOGGING_ARGS[@]}
