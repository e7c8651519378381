#!/bin/bash
# usage: run_peaks.sh TAG DTYPE N [extra flags]  -> /work/peaks/TAG/{log,run/metrics.csv}
TAG=$1; DT=$2; N=$3; shift 3
cd /work/meas
export PYTHONPATH=/work/meas TFFL_FROZEN_DIR=/tmp/frz_$TAG TF_CPP_MIN_LOG_LEVEL=3
rm -rf /tmp/frz_$TAG /work/peaks/$TAG; mkdir -p /work/peaks/$TAG
echo "commit $(git rev-parse --short HEAD) started $(date -u +%FT%TZ)" > /work/peaks/$TAG/info
/usr/bin/time -v .venv/bin/python scripts/train.py --task=sst2_instruct --backbone=gemma3_270m --algorithm=rolora \
 --rank=8 --lora_targets=query,value --lora_layers=14,15,16,17 --num_clients=$N \
 --clients_per_round=$N --rounds=2 --local_steps=2 --batch_size=8 --learning_rate=0.1 \
 --base_dtype=$DT --data_dir=/work/shared/data --output_dir=/work/peaks/$TAG/run "$@" > /work/peaks/$TAG/log 2>&1
echo "exit $? ended $(date -u +%FT%TZ)" >> /work/peaks/$TAG/info
rm -rf /tmp/frz_$TAG
