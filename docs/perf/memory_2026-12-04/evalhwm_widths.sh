#!/bin/bash
# usage: evalhwm.sh TAG DTYPE [ENV=VALUE ...] -> /work/evh3/TAG.log (calls, VmHWM)
TAG=$1; DT=$2; shift 2
mkdir -p /work/evh3; cd /work/main
env PYTHONPATH=/work/main TF_CPP_MIN_LOG_LEVEL=3 TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 TFFL_FROZEN_DIR=/tmp/frz_evh_$TAG "$@" \
  /usr/bin/time -v .venv/bin/python docs/perf/memory_2026-12-04/evalprobe_widths.py 2 $DT > /work/evh3/$TAG.log 2>&1
rm -rf /tmp/frz_evh_$TAG
