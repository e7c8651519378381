"""Resident memory and seconds of one traced training step (two dense layers of Gemma 3 270M's
width, 640 -> 2048 -> 640, batch 8) over 160 batches whose widths run through 30..109 tokens,
each width cut as is or rounded up to a multiple of M (argv[1]).

    python onednn_widths.py 1     # every width its own shape
    python onednn_widths.py 8     # widths in multiples of 8
    TF_ENABLE_ONEDNN_OPTS=0 python onednn_widths.py 1

Prints the growth of VmRSS over the 160 steps (after two warm-up steps at the widest and a
middle width, so that TensorFlow's pool already holds the largest buffers) and the mean step.
"""
import sys
import time

import tensorflow as tf

multiple = int(sys.argv[1])


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024


w = tf.Variable(tf.random.normal([640, 2048]))
w2 = tf.Variable(tf.random.normal([2048, 640]))


@tf.function(input_signature=[tf.TensorSpec([8, None, 640])])
def step(x):
    with tf.GradientTape() as tape:
        y = tf.einsum("bsf,fd->bsd", tf.nn.gelu(tf.einsum("bsd,df->bsf", x, w)), w2)
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, [w, w2])


for width in (112, 64):
    step(tf.ones([8, width, 640]))
start, t = rss_mb(), time.perf_counter()
widths = set()
for i in range(160):
    width = -(-(30 + (i * 37) % 80) // multiple) * multiple
    widths.add(width)
    step(tf.ones([8, width, 640]))
print(f"multiple {multiple}: {len(widths)} widths, VmRSS +{rss_mb() - start} MB, "
      f"{(time.perf_counter() - t) / 160:.4f} s a step")
