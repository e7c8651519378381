"""Why `--runtime=distribute` keeps TFF's Grappler pass: RoLoRA's B round of
tests/tffl/runtime/test_graph_optimization.py's model (a layer norm, a GELU, a LoRA'd dense
layer; three clients of 4, 6 and 3 rows), run in-process on CPU:0 with the round's client
computations compiled with the pass ("tff") or without it ("none",
`tffl.runtime.graph_optimization.compiler("none")`), with 1, 2 or 3 clients trained at once
(`clients_in_parallel`: each slot its own instance of every function). Each row: the B round's
train loss on all three clients, then on the first, the second and the third alone, from the
same starting state.

    uv run python docs/perf/distribute_2026-12-04/in_process_without_the_pass.py
"""

import tensorflow as tf

from tests.tffl.runtime import test_graph_optimization as model
from tffl.algorithms import lora_fl
from tffl.runtime import distribute, graph_optimization
from tffl.runtime.tff_internals import compiler_pipeline, context_stack_impl

spec = (tf.TensorSpec([None, model._D_IN], tf.float32),
        tf.TensorSpec([None, model._D_OUT], tf.float32))
process = lora_fl.build_lora_process("rolora", model._model_fn, spec, 0.1,
                                     loss_fn=tf.keras.losses.MeanSquaredError)
data = [tf.data.Dataset.from_tensor_slices(c).batch(2) for c in model._CLIENTS]
for choice, parallel in (("tff", 1), ("tff", 2), ("none", 1), ("none", 2), ("none", 2),
                         ("none", 3)):
    context = distribute.DistributeContext(distribute.build_strategy("CPU:0"),
                                           clients_in_parallel=parallel)
    context._pipeline = compiler_pipeline.CompilerPipeline(graph_optimization.compiler(choice))
    with context_stack_impl.context_stack.install(context):
        state = process.initialize()
        losses = [float(process.next_round(state, clients).metrics["b_round"]["client_work"]
                        ["train"]["loss"]) for clients in (data, data[:1], data[1:2], data[2:])]
    print(f"pass {choice}, {parallel} at once: " + ", ".join(f"{v:.6f}" for v in losses),
          flush=True)
