"""tffl.runtime.graph_optimization: TFF's compiler with or without its Grappler pass.

Grappler rewrites graphs without changing what they compute: RoLoRA's B and A rounds on a Keras
model with a layer norm, a GELU and a LoRA'd dense layer give the same states and metrics on the
worker either way. And the pass is really skipped: a product of two constants is folded into one
constant by TFF's pass and left as traced without it."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl import runtime
from tffl.algorithms import lora_fl
from tffl.engine import roles
from tffl.runtime import graph_optimization
from tffl.runtime import workers as workers_lib
from tffl.runtime.tff_internals import transformation_utils

_RNG = np.random.default_rng(7)
_D_IN, _D_OUT, _R = 5, 3, 2
_CLIENTS = [(_RNG.normal(size=(n, _D_IN)).astype(np.float32),
             _RNG.normal(size=(n, _D_OUT)).astype(np.float32)) for n in (4, 6, 3)]


class _Lora(tf.keras.layers.Layer):
    def build(self, input_shape):
        init = tf.constant_initializer
        self.kernel = self.add_weight(name="kernel", shape=(_D_IN, _D_OUT), trainable=False,
                                      initializer=init(_RNG.normal(size=(_D_IN, _D_OUT))))
        self.lora_a = self.add_weight(name="lora_a", shape=(_D_IN, _R),
                                      initializer=init(_RNG.normal(size=(_D_IN, _R))))
        self.lora_b = self.add_weight(name="lora_b", shape=(_R, _D_OUT), initializer="zeros")
        roles.tag(self.kernel, roles.FROZEN)
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)

    def call(self, x):
        return x @ self.kernel + (x @ self.lora_a) @ self.lora_b


def _model_fn():
    x = tf.keras.Input((_D_IN,))
    h = tf.keras.layers.LayerNormalization(trainable=False)(x)
    return tf.keras.Model(x, _Lora()(tf.nn.gelu(h)))


def _two_rounds(process, graph_optimization_name):
    data = [tf.data.Dataset.from_tensor_slices(c).batch(2) for c in _CLIENTS]
    with runtime.local_runtime(graph_optimization=graph_optimization_name):
        state = process.initialize()
        outputs = []
        for _ in range(2):   # a B round, then an A round
            output = process.next_round(state, data)
            state = output.state
            outputs.append(output.metrics)
    assert workers_lib.running_workers() == []
    return state, outputs


@pytest.fixture(scope="module")
def process():
    spec = (tf.TensorSpec([None, _D_IN], tf.float32), tf.TensorSpec([None, _D_OUT], tf.float32))
    return lora_fl.build_lora_process("rolora", _model_fn, spec, 0.1,
                                      loss_fn=tf.keras.losses.MeanSquaredError)


def test_rounds_without_the_pass_equal_those_with_it(process):
    with_pass = _two_rounds(process, "tff")
    without = _two_rounds(process, "none")
    leaves = list(zip(tf.nest.flatten(with_pass), tf.nest.flatten(without), strict=True))
    assert sum(np.size(a) for a, _ in leaves) > 20
    for a, b in leaves:
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    b_factors = [v for v in tf.nest.flatten(with_pass[0].global_model_weights.trainable)
                 if np.shape(v) == (_R, _D_OUT)]
    assert b_factors and np.abs(b_factors[0]).max() > 0   # the B round trained something


def _graph_nodes(comp) -> list[str]:
    """The op types of every TensorFlow graph in compiled `comp`."""
    ops = []
    for node in _compiled_blocks(comp.to_building_block()):
        graph_def = tf.compat.v1.GraphDef()
        node.proto.tensorflow.graph_def.Unpack(graph_def)
        ops += [n.op for n in graph_def.node]
        ops += [n.op for f in graph_def.library.function for n in f.node_def]
    return ops


def _compiled_blocks(block):
    found = []

    def visit(b):
        if type(b).__name__ == "CompiledComputation":
            found.append(b)
        return b, False

    transformation_utils.transform_postorder(block, visit)
    return found


def test_the_pass_folds_constants_and_none_leaves_them():
    @tff.tensorflow.computation(tf.float32)
    def scaled(x):
        return x * (tf.constant(2.0) * tf.constant(3.0))

    folded = _graph_nodes(graph_optimization.compiler("tff")(scaled))
    traced = _graph_nodes(graph_optimization.compiler("none")(scaled))
    assert traced.count("Mul") == 2 and folded.count("Mul") == 1
    for choice in graph_optimization.GRAPH_OPTIMIZATIONS:
        with runtime.local_runtime(graph_optimization=choice):
            assert scaled(1.5) == pytest.approx(9.0)
    assert workers_lib.running_workers() == []


def test_an_unknown_choice_is_one_line():
    with pytest.raises(ValueError, match="graph optimization 'fast': choose from tff, none"), \
            runtime.local_runtime(graph_optimization="fast"):
        pass
    assert workers_lib.running_workers() == []
