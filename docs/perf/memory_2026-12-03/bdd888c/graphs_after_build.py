"""The driver's VmRSS and its live TensorFlow graphs once `scripts/train.py FLAGS` has built its
process (then it stops): what PERFORMANCE.md's "1 graph instead of 16" and "1.85 GB instead of
2.73 GB" come from. Run from the repository's root:

    PYTHONPATH=. .venv/bin/python docs/perf/memory_2026-12-03/bdd888c/graphs_after_build.py \
        --task=sst2_instruct --backbone=gemma3_270m --algorithm=rolora --rank=8 \
        --lora_targets=query,value --lora_layers=14,15,16,17 --num_clients=3 \
        --clients_per_round=3 --rounds=2 --local_steps=2 --batch_size=8 --learning_rate=0.1 \
        --base_dtype=int8 --data_dir=../shared/data --output_dir=/tmp/probe
"""
import collections
import gc
import sys

from runner import training
from scripts import train


def _rss_kb() -> str:
    return next(line.split()[1] for line in open("/proc/self/status")
                if line.startswith("VmRSS"))


_build = training.build_run_process


def _probe(*args, **kwargs):
    _build(*args, **kwargs)
    gc.collect()
    from tensorflow.python.framework import ops

    graphs = [o for o in gc.get_objects() if isinstance(o, ops.Graph)]
    print(f"VmRSS after the build: {_rss_kb()} kB; live graphs: {len(graphs)} "
          f"{dict(collections.Counter(type(g).__name__ for g in graphs))}", flush=True)
    raise SystemExit(0)


training.build_run_process = _probe
sys.exit(train.run_command_line(["train.py"] + sys.argv[1:]))
