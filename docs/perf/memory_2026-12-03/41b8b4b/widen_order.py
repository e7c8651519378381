import sys, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from models import base_precision as bp
mode = sys.argv[1]
layers = [bp.Int8Dense(2048, use_bias=False, kernel_initializer="zeros") for _ in range(24)]
x0 = tf.ones((1, 2048))
for l in layers: l(x0)
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")): print(line.strip(), end="  ")
    print()
@tf.function
def f(x):
    for l in layers:
        if mode == "dep":
            with tf.control_dependencies([x]):
                k = l.widened_kernel()
            x = tf.matmul(x, k) + 1.0
        else:
            x = l(x) + 1.0
    return x
hwm(); f(x0); hwm(); f(x0); hwm()
