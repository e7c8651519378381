"""Tests of `tffl.engine.client_training`: the one client loop against numpy SGD, its graph form, and
`build_model(zero_init=True)`."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training, model_spec


def _linear_model_fn():
    inputs = tf.keras.Input(shape=(3,))
    hidden = tf.keras.layers.Dense(2, use_bias=False, name="w",
                                   kernel_initializer="glorot_uniform")(inputs)
    outputs = tf.keras.layers.Dense(1, use_bias=False, name="v",
                                    kernel_initializer="glorot_uniform")(hidden)
    return tf.keras.Model(inputs, outputs)


INPUT_SPEC = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))


def _batches(seed=0, num_batches=3, batch_size=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_batches * batch_size, 3)).astype(np.float32)
    y = rng.normal(size=(num_batches * batch_size, 1)).astype(np.float32)
    return x, y, tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def _mse(y, pred):
    return tf.reduce_mean(tf.square(y - pred))


def test_phased_loop_equals_numpy_sgd_phase_by_phase():
    model = model_spec.build_model(_linear_model_fn, INPUT_SPEC)
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    v0 = rng.normal(size=(2, 1)).astype(np.float32)
    x, y, dataset = _batches()
    lr = 0.1
    # Phase 1: 2 epochs on v only; phase 2: 1 epoch on w only.
    loop = client_training.build_phased_loop(model, _mse, lr, [
        client_training.Phase((1,), epochs=2), client_training.Phase((0,), epochs=1)])
    out = loop(tff.learning.models.ModelWeights(trainable=[w0, v0], non_trainable=[]), dataset)

    w, v = w0.astype(np.float64), v0.astype(np.float64)
    for _ in range(2):
        for k in range(3):
            xb, yb = x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]
            r = xb @ w @ v - yb                       # residual, (4, 1)
            v = v - lr * (2 / 4) * (xb @ w).T @ r     # ∂/∂v mean(r²)
    loss_sum = 0.0
    for k in range(3):
        xb, yb = x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]
        r = xb @ w @ v - yb
        loss_sum += 4 * np.mean(r ** 2)               # n_k · ℓ_k before the step
        w = w - lr * (2 / 4) * xb.T @ r @ v.T         # ∂/∂w mean(r²)
    np.testing.assert_allclose(out["trainable"][0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["trainable"][1], v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["loss_sum"], loss_sum, rtol=1e-5)
    assert float(out["num_examples"]) == 12.0


def test_phased_loop_is_a_while_loop_not_a_dataset_reduce():
    model = model_spec.build_model(_linear_model_fn, INPUT_SPEC)
    loop = client_training.build_phased_loop(model, _mse, 0.1, [client_training.Phase((0, 1))])
    _, _, dataset = _batches()
    weights = tff.learning.models.ModelWeights(
        trainable=[tf.TensorSpec([3, 2]), tf.TensorSpec([2, 1])], non_trainable=[])
    graph = loop.get_concrete_function(weights, dataset).graph
    ops = {op.type for op in graph.get_operations()}
    assert "ReduceDataset" not in ops
    assert {"While", "StatelessWhile"} & ops


def test_zero_init_builds_zeros_and_the_default_keeps_the_initializer():
    with tf.Graph().as_default():
        zeros = model_spec.build_model(_linear_model_fn, INPUT_SPEC, zero_init=True)
        random = model_spec.build_model(_linear_model_fn, INPUT_SPEC)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            zero_values = session.run(zeros.trainable_variables)
            random_values = session.run(random.trainable_variables)
    assert [v.shape for v in zero_values] == [(3, 2), (2, 1)]
    assert all(not v.any() for v in zero_values)
    assert all(np.abs(v).sum() > 0 for v in random_values)


def test_element_type_sorts_plain_dict_keys():
    spec = {"y": tf.TensorSpec([None], tf.int32), "x": tf.TensorSpec([None, 2], tf.float32)}
    element = model_spec.element_type(spec)
    assert [name for name, _ in tff.structure.iter_elements(element)] == ["x", "y"]


_VIRTUAL_DEVICES_PROGRAM = r"""
import numpy as np, tensorflow as tf, tensorflow_federated as tff
(cpu,) = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tests.tffl.engine import test_client_training as t
from tffl.engine import client_training, model_spec

x, y, dataset = t._batches()
weights = tff.learning.models.ModelWeights(
    trainable=[np.full((3, 2), 0.1, np.float32), np.full((2, 1), 0.2, np.float32)],
    non_trainable=[])
results = {}
for device in ("/device:CPU:0", "/device:CPU:1"):
    with client_training.placed(device):
        model = model_spec.build_model(t._linear_model_fn, t.INPUT_SPEC)
    loop = client_training.build_phased_loop(model, t._mse, 0.1, [client_training.Phase((0, 1))],
                                             device=device)
    out = loop(weights, dataset)
    assert all(v.device.endswith(device) for v in model.trainable_variables), device
    graph = loop.get_concrete_function(weights, dataset).graph
    placed = [op for op in graph.get_operations() if op.type == "While"]
    assert placed and all(op.device.endswith(device) for op in placed), device
    results[device] = [np.asarray(v) for v in out["trainable"]]
for a, b in zip(*results.values()):
    np.testing.assert_allclose(a, b, rtol=1e-6)
print("ok", len(tf.config.list_logical_devices("CPU")))
"""


@pytest.mark.large  # a child process (virtual devices are set before TensorFlow runs an op)
def test_loop_runs_on_the_given_virtual_cpu_device():
    """Two virtual CPU devices (configured before TensorFlow runs its first op, hence a child
    forked from a Python that has imported TensorFlow but run nothing: tests/forked_python.py):
    the model's variables and the loop's ops sit on the device asked for, with equal results."""
    from tests import forked_python

    child = forked_python.spawn(_VIRTUAL_DEVICES_PROGRAM)
    try:
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, stderr[-3000:]
    stdout = stdout or ""
    assert stdout.split()[-2:] == ["ok", "2"]
