"""The sst2_instruct dev evaluation's calls on the zero-shot model (argv: calls, base dtype), as
benchmarks/evaluation.py makes them, with the stages (PROBE lines) that evaluation_stages.patch
prints. Run by evaluation_stages.sh."""
import sys, time
import tensorflow_federated as tff
from tasks import registry
from tasks.task_config import TaskSpec
def mem():
    d = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")): d[line.split(":")[0]] = int(line.split()[1]) // 1024
    return d
spec = TaskSpec().with_changes(task="sst2_instruct", backbone="gemma3_270m", data_dir="/work/shared/data", num_clients=3, rank=8, lora_layers=(14, 15, 16, 17), seed=0, base_dtype=sys.argv[2])
task = registry.build_run_task(spec)
model = task.keras_model_fn()
weights = tff.learning.models.ModelWeights([v.numpy() for v in model.trainable_variables], task.pretrained_non_trainable())
del model
print("BEFORE", mem(), flush=True)
for call in range(int(sys.argv[1])):
    t = time.perf_counter()
    m = task.evaluate(weights)
    print("CALL", call, round(time.perf_counter() - t, 1), m["loss"], m["accuracy"], m["likelihood_accuracy"], mem(), flush=True)
