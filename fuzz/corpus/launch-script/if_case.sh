DTYPE=${2:-fp8}
if [ "$DTYPE" = fp8 ]; then P="--fp8-format hybrid"; elif [[ $DTYPE == bf* ]]; then P=--bf16; else P=--fp16; fi
case $1 in
  4|8) TP=$1 ;;
  *) TP=1 ;;
esac
[ -z "$X" ] && X=1 || X=2
if (( TP > 2 )); then SP=--sequence-parallel; fi
torchrun --nproc_per_node 8 pretrain_gpt.py $P --tensor-model-parallel-size $TP $SP --x $X
