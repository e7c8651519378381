"""Peak RSS of the 1B-shaped decoder's random starting values as `tasks.instruct_run_task` reads
them from f664033 on: `random_values` on a backbone built in a graph. From the repository's
root: PYTHONPATH=. .venv/bin/python THIS int8"""
import resource, sys, time
import tensorflow as tf
from models import decoders, causal_lm
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
t = time.time()
decoder = decoders.build_decoder("gemma3_1b_random", sys.argv[1])
print("decoder", round(rss()), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
with tf.Graph().as_default():
    backbone = decoder.backbone_fn()
    values = decoder.pretrained_values(backbone)
    frozen = causal_lm.build_causal_lm(backbone).non_trainable_variables
    vals = [values.pop(v.ref()) for v in frozen]
print("values", round(rss()), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, round(time.time() - t), sum(v.nbytes for v in vals) // 2**20, flush=True)
