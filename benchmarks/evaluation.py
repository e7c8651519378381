"""`--suite=targets`'s evaluation part (benchmarks/targets.py): the seconds of `sst2_instruct`'s
dev evaluation on Gemma 3 270M.

The task is the one `scripts/train.py --task=sst2_instruct --backbone=gemma3_270m` builds
(`tasks.instruct_run_task`; RoLoRA's budget: LoRA r = 8 on query and value of layers 14-17), its
model at the pretrained weights (LoRA's B = 0: the zero-shot model). Its `evaluate` reads the 872
dev sentences; " negative" and " positive" are one token each for Gemma 3, so one forward pass
per batch gives every measure (`instruct_run_task.make_evaluator`). The first call traces the
graph; the target is the calls after it: at most `TARGETS["evaluation_seconds"]` (60 s) on 2
cores (`benchmarks.config`).
"""

from __future__ import annotations

import time

from benchmarks.config import TargetsConfig

EVALUATION_CALLS = 3  # the first traces; the mean of the others is the figure


def run_evaluation(config: TargetsConfig, log) -> dict:
    """{"first_call_seconds", "seconds" (the later calls' mean), "calls", "metrics"} of the
    dev evaluation (module docstring)."""
    import tensorflow_federated as tff

    from tasks import registry
    from tasks.task_config import TaskSpec

    spec = TaskSpec().with_changes(
        task="sst2_instruct", backbone="gemma3_270m", data_dir=config.data_dir, num_clients=3,
        rank=8, lora_layers=(14, 15, 16, 17), seed=config.seed)
    task = registry.build_run_task(spec)
    model = task.keras_model_fn()
    weights = tff.learning.models.ModelWeights(
        [v.numpy() for v in model.trainable_variables], task.pretrained_non_trainable())
    seconds = []
    for call in range(EVALUATION_CALLS):
        started = time.perf_counter()
        metrics = task.evaluate(weights)
        seconds.append(time.perf_counter() - started)
        log(f"evaluation: call {call + 1}/{EVALUATION_CALLS}, {seconds[-1]:.1f} s, "
            f"generation accuracy {metrics['accuracy']:.4f}")
    return {"first_call_seconds": seconds[0],
            "seconds": sum(seconds[1:]) / (len(seconds) - 1), "calls": seconds,
            "metrics": metrics}
