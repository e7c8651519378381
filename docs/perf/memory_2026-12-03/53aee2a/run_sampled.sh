#!/bin/bash
# usage: run_sampled.sh TAG DTYPE N [extra flags], from a checkout: the two-round RoLoRA run of
# docs/PERFORMANCE.md ("Memory at scale"), its folder under $OUT_ROOT (default /tmp/tffl_memory),
# with every process's VmRSS read each half second into rss.txt.
TAG=$1; DTYPE=$2; N=$3; shift 3
OUT=${OUT_ROOT:-/tmp/tffl_memory}/$TAG; rm -rf $OUT; mkdir -p $OUT
export TF_CPP_MIN_LOG_LEVEL=3
.venv/bin/python scripts/train.py --task=sst2_instruct --backbone=gemma3_270m --algorithm=rolora \
  --rank=8 --lora_targets=query,value --lora_layers=14,15,16,17 --num_clients=$N \
  --clients_per_round=$N --rounds=2 --local_steps=2 --batch_size=8 --learning_rate=0.1 \
  --base_dtype=$DTYPE --data_dir=../shared/data --output_dir=$OUT/run "$@" > $OUT/log.txt 2>&1 &
PID=$!
start=$(date +%s.%N)
while kill -0 $PID 2>/dev/null; do
  for p in $(pgrep -f "scripts/train.py.*$OUT/run") $(pgrep -f worker_binary); do
    r=$(awk '/VmRSS/{print $2}' /proc/$p/status 2>/dev/null)
    c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-40)
    echo "$(echo "$(date +%s.%N) - $start" | bc) $p $r $c"
  done >> $OUT/rss.txt
  sleep 0.5
done
wait $PID; echo "rc=$?" >> $OUT/log.txt
