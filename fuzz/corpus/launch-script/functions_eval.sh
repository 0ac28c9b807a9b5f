setup() {
  local n=$1
  LAYERS=$((n * 8))
  return 0
}
function launch {
  run_cmd="torchrun --nproc_per_node $1 pretrain_qwen.py --num-layers ${LAYERS} --name 'a b' $@"
  eval ${run_cmd}
}
setup 4
cat <<-EOF > /dev/null
	python pretrain_gpt.py --ignored
	EOF
launch 2 --seq-length 4096
exit 0
