"""Seconds of the stages of sst2_instruct's dev evaluation on Gemma 3 270M (zero-shot, RoLoRA's
budget), as scripts/benchmark.py's evaluation part builds it. From the repository's root, with
evaluation_stages.patch applied (it prints each stage, and computes the kept prefix twice on the
first call, to tell its compute from its first trace):

    git apply docs/perf/memory_2026-12-03/5d8507c/evaluation_stages.patch
    PYTHONPATH=. .venv/bin/python docs/perf/memory_2026-12-03/5d8507c/evaluation_stages.py \
        CALLS ../shared/data [BASE_DTYPE]
"""
import sys, time
import tensorflow_federated as tff
from tasks import registry
from tasks.task_config import TaskSpec
spec = TaskSpec().with_changes(task="sst2_instruct", backbone="gemma3_270m", data_dir=sys.argv[2], num_clients=3, rank=8, lora_layers=(14, 15, 16, 17), seed=0,
                               base_dtype=sys.argv[3] if len(sys.argv) > 3 else "float32")
task = registry.build_run_task(spec)
model = task.keras_model_fn()
weights = tff.learning.models.ModelWeights([v.numpy() for v in model.trainable_variables], task.pretrained_non_trainable())
for call in range(int(sys.argv[1])):
    t = time.perf_counter()
    m = task.evaluate(weights)
    print("CALL", call, round(time.perf_counter() - t, 1), m["accuracy"], m["likelihood_accuracy"], flush=True)
