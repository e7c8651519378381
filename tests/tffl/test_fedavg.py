"""tffl.fedavg: one round of FedAvg equals an independent numpy computation of the same update."""

import numpy as np
import pytest
import tensorflow as tf

from tffl import fedavg
from tffl import runtime


def _linear():
    return tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def test_one_round_matches_numpy():
    """Loss L_i(w) = mean_n (x_n·w − y_n)²; one full-batch SGD step per client from w0 = 0:
    w_i = w0 − lr·∇L_i(w0) with ∇L_i(w) = (2/n_i) X_iᵀ(X_i w − y_i); server (lr 1):
    w1 = Σ n_i w_i / Σ n_i."""
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32))
               for n in (4, 7, 2)]
    lr = 0.05
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))
    process = fedavg.build_fedavg(
        _linear, spec, client_learning_rate=lr, loss_fn=tf.keras.losses.MeanSquaredError,
        metrics_fn=lambda: [],
    )
    datasets = [tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)) for x, y in clients]
    with runtime.local_runtime():
        state = process.initialize()
        state = process.next(state, datasets).state
        w1 = process.get_model_weights(state).trainable[0]

    w0 = np.zeros((3, 1))
    local = [w0 - lr * (2 / len(x)) * x.T @ (x @ w0 - y) for x, y in clients]
    counts = np.array([len(x) for x, _ in clients], float)
    expected = sum(n * w for n, w in zip(counts, local)) / counts.sum()
    np.testing.assert_allclose(w1, expected, rtol=1e-5, atol=1e-6)


def test_bad_learning_rate():
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))
    with pytest.raises(ValueError, match="client_learning_rate=0"):
        fedavg.build_fedavg(_linear, spec, client_learning_rate=0)
