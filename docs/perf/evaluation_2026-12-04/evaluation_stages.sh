#!/bin/bash
# usage: evaluation_stages.sh TAG DTYPE [ENV=VALUE ...] -> TAG.log
# Run from a checkout at 444038c with evaluation_stages.patch applied (git apply): the
# sst2_instruct dev evaluation's stages, two calls, as scripts/train.py's driver allocates
# (the system allocator). EVX_SIG=1: the graphs traced once with every dimension unknown (what
# the evaluator now does); unset: as at 444038c.
TAG=$1; DT=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
env PYTHONPATH=. TF_CPP_MIN_LOG_LEVEL=3 TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 TFFL_FROZEN_DIR=/tmp/frz_stages_$TAG "$@" \
  /usr/bin/time -v .venv/bin/python "$HERE/evaluation_stages.py" 2 "$DT" > "$TAG.log" 2>&1
rm -rf /tmp/frz_stages_$TAG
