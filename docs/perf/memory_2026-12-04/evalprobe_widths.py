import sys, time, ctypes
from benchmarks.config import TargetsConfig
from benchmarks import evaluation
import tensorflow_federated as tff
from tasks import registry
import os
from tasks import instruct_run_task as irt
if os.environ.get("EVAL_M"):
    _orig = irt.AnswerAppender
    class _A(_orig):
        def __init__(self, answers, pad_id, width_multiple=1, max_width=None):
            super().__init__(answers, pad_id, max(width_multiple, int(os.environ["EVAL_M"])), max_width)
    irt.AnswerAppender = _A
    print("EVAL_M", os.environ["EVAL_M"], flush=True)
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
print("BEFORE", mem(), flush=True)
# reset the high-water mark so that the calls' own peak shows
open("/proc/self/clear_refs", "w").write("5")
print("RESET", mem(), flush=True)
for call in range(int(sys.argv[1])):
    t = time.perf_counter()
    m = task.evaluate(weights)
    print("CALL", call, round(time.perf_counter() - t, 1), m["accuracy"], m["likelihood_accuracy"], mem(), flush=True)
