"""Peak RSS of the 1B-shaped decoder's random starting values drawn eagerly (`pretrained_fn()`,
then the values read back), as `tasks.instruct_run_task` did before f664033 (run it at 093e583
for the eager draw; from f664033 on, `pretrained_fn()` assigns `random_values`). From the
repository's root: PYTHONPATH=. .venv/bin/python THIS int8"""
import resource, sys, time
import tensorflow as tf
from models import decoders, causal_lm, lora_targets
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
t = time.time()
decoder = decoders.build_decoder("gemma3_1b_random", sys.argv[1])
print("decoder", round(rss()), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
backbone = decoder.pretrained_fn()
print("backbone", round(rss()), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, round(time.time() - t), flush=True)
lm = causal_lm.build_causal_lm(backbone)
vals = [v.numpy() for v in lm.non_trainable_variables]
print("values", round(rss()), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, round(time.time() - t), flush=True)
