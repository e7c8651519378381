#!/bin/bash
# usage: heaptrack_run_one.sh TAG DTYPE PORT [WORKER_ENV, e.g. TF_ENABLE_ONEDNN_OPTS=0]
set -u
TAG=$1; DTYPE=$2; PORT=$3; WENV=${4:-}
cd /work/exp73b; export PYTHONPATH=/work/exp73b
H=/work/exp73b/heap
env ${WENV:-X_UNUSED=1} heaptrack -o $H/worker_$TAG /work/main/.venv/lib/python3.11/site-packages/tensorflow_federated/data/worker_binary --port=$PORT --max_concurrent_computation_calls=1 > $H/worker_$TAG.out 2>&1 &
HPID=$!
echo "heaptrack pid $HPID" > $H/pids_$TAG.txt
sleep 8
WPID=$(pgrep -f -- "worker_binary --port=$PORT" | while read p; do if [ "$(cat /proc/$p/comm)" != "heaptrack" ] && grep -q worker_binary /proc/$p/cmdline && ! grep -q "^heaptrack" /proc/$p/cmdline; then echo $p; fi; done | head -1)
echo "worker pid $WPID" >> $H/pids_$TAG.txt
cat /proc/$WPID/cmdline | tr '\0' ' ' >> $H/pids_$TAG.txt; echo >> $H/pids_$TAG.txt
# sampler of worker RSS
( while kill -0 $WPID 2>/dev/null; do echo "$(date +%s) $(grep -E 'VmRSS|VmHWM' /proc/$WPID/status | tr -s ' ' | tr '\n' ' ')"; sleep 1; done ) > $H/rss_$TAG.txt 2>/dev/null &
SPID=$!
/usr/bin/time -v .venv/bin/python scripts/train.py --task=sst2_instruct --backbone=gemma3_270m --algorithm=rolora --rank=8 --lora_targets=query,value --lora_layers=14,15,16,17 --num_clients=3 --clients_per_round=3 --rounds=2 --local_steps=2 --batch_size=8 --learning_rate=0.1 --base_dtype=$DTYPE --data_dir=../shared/data --output_dir=$H/run_$TAG --worker_addresses=localhost:$PORT > $H/driver_$TAG.log 2>&1
echo "driver rc $?" >> $H/pids_$TAG.txt
grep -E 'VmHWM|VmRSS' /proc/$WPID/status > $H/status_$TAG.txt
cat /proc/$WPID/smaps_rollup > $H/smaps_rollup_$TAG.txt
kill -TERM $WPID
wait $HPID
echo "heaptrack rc $?" >> $H/pids_$TAG.txt
kill $SPID 2>/dev/null
echo done >> $H/pids_$TAG.txt
