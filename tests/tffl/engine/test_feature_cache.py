"""Tests of `tffl.engine.feature_cache` through `tffl.engine.client_training.build_phased_loop`: a head-only
phase equals numpy softmax-regression SGD on the body's features, runs the body once per batch,
and falls back to whole-model epochs when the body is stochastic or the phase opts out."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training
from tffl.engine import model_spec
from tffl.engine import feature_cache

D, Z, C = 3, 2, 3  # input, feature and class dimensions
SIZES = (4, 4, 2)  # a ragged last batch
EPOCHS = 3


class _CallCounter(tf.keras.layers.Layer):
    """The identity, counting its calls in a non-trainable variable."""

    def build(self, input_shape):
        self.calls = self.add_weight("calls", shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        self.calls.assign_add(1.0)
        return x


def _model(dropout=0.0):
    inputs = tf.keras.Input((D,))
    z = tf.keras.layers.Dense(Z, use_bias=False, name="body")(_CallCounter(name="count")(inputs))
    z = tf.keras.layers.Dropout(dropout, name="drop")(z)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(C, name="head")(z))


def _data(mapping=False):
    rng = np.random.default_rng(0)
    n = sum(SIZES)
    x = rng.normal(size=(n, D)).astype(np.float32)
    y = rng.integers(0, C, size=n).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices({"x": x, "y": y} if mapping else (x, y))
    return x, y, dataset.batch(SIZES[0])


def _run(model, dataset, cache_features=True):
    """Trains the head (kernel, bias) for EPOCHS epochs; -> (loop output, body calls)."""
    rng = np.random.default_rng(1)
    values = [rng.normal(size=v.shape).astype(np.float32) for v in model.trainable_variables]
    loop = client_training.build_phased_loop(
        model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), 0.5,
        [client_training.Phase((1, 2), EPOCHS, cache_features=cache_features)])
    out = loop(tff.learning.models.ModelWeights(trainable=values, non_trainable=[0.0]), dataset)
    return values, out, float(model.get_layer("count").calls.numpy())


def _numpy_head_sgd(x, y, w, h, b, lr=0.5):
    """EPOCHS passes of SGD on the softmax regression (h, b) over features z = x·w, in float64;
    -> (h, b, Σ_k n_k·ℓ_k over all passes)."""
    z = x.astype(np.float64) @ w
    loss_sum = 0.0
    bounds = np.cumsum((0,) + SIZES)
    for _ in range(EPOCHS):
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            logits = z[lo:hi] @ h + b
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            onehot = np.eye(C)[y[lo:hi]]
            loss_sum += -np.sum(np.log(p[onehot == 1]))
            g = (p - onehot) / (hi - lo)
            h, b = h - lr * z[lo:hi].T @ g, b - lr * g.sum(0)
    return h, b, loss_sum


@pytest.mark.parametrize("mapping", [False, True])
def test_cached_head_phase_equals_numpy_and_runs_the_body_once_per_batch(mapping):
    model = model_spec.build_model(_model, (tf.TensorSpec([None, D]),
                                                 tf.TensorSpec([None], tf.int32)))
    x, y, dataset = _data(mapping)
    (w, h, b), out, calls = _run(model, dataset)
    h_np, b_np, loss_np = _numpy_head_sgd(x, y, w.astype(np.float64), h.astype(np.float64),
                                          b.astype(np.float64))
    np.testing.assert_allclose(out["trainable"][1], h_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["trainable"][2], b_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["trainable"][0], w)  # the body is not trained
    np.testing.assert_allclose(out["loss_sum"], loss_np, rtol=1e-5)
    assert float(out["num_examples"]) == EPOCHS * sum(SIZES)
    assert calls == len(SIZES)  # one body pass, not EPOCHS


@pytest.mark.parametrize("dropout,cache_features", [(0.5, True), (0.0, False)])
def test_a_stochastic_body_or_an_opt_out_runs_the_whole_model_every_epoch(dropout,
                                                                         cache_features):
    model = model_spec.build_model(lambda: _model(dropout),
                                        (tf.TensorSpec([None, D]), tf.TensorSpec([None], tf.int32)))
    _, _, dataset = _data()
    _, _, calls = _run(model, dataset, cache_features)
    assert calls == EPOCHS * len(SIZES)


def test_head_split_only_for_the_output_layer_of_a_deterministic_body():
    model = _model()
    kernel, head_kernel = model.get_layer("body").kernel, model.get_layer("head").kernel
    body, head = feature_cache.head_split(model, [head_kernel])
    assert head is model.get_layer("head") and body.output_shape == (None, Z)
    assert feature_cache.head_split(model, [head_kernel, kernel]) is None
    noisy = _model(dropout=0.1)
    assert feature_cache.head_split(noisy, [noisy.get_layer("head").kernel]) is None
    assert feature_cache.stochastic_layers(
        tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.layers.BatchNormalization(
            name="bn")])) == ["bn"]


def _bn_model():
    """_model with a frozen batch normalization between the body and the head."""
    inputs = tf.keras.Input((D,))
    z = tf.keras.layers.Dense(Z, use_bias=False, name="body")(_CallCounter(name="count")(inputs))
    bn = tf.keras.layers.BatchNormalization(epsilon=0.01, name="bn")
    bn.trainable = False
    return tf.keras.Model(inputs, tf.keras.layers.Dense(C, name="head")(bn(z)))


def test_a_frozen_batch_norm_is_a_fixed_affine_map_and_its_body_is_cached():
    model = model_spec.build_model(_bn_model, (tf.TensorSpec([None, D]),
                                                    tf.TensorSpec([None], tf.int32)))
    assert feature_cache.stochastic_layers(model) == []
    bn_stats = {"gamma": [1.5, -0.5], "beta": [0.2, -1.0], "moving_mean": [0.3, -0.7],
                "moving_variance": [2.0, 0.5]}
    non_trainable = [np.float32(0.0) if v.name.startswith("count") else np.asarray(
        bn_stats[v.name.split("/")[-1].split(":")[0]], np.float32)
        for v in model.non_trainable_variables]
    x, y, dataset = _data()
    rng = np.random.default_rng(1)
    w, h, b = [rng.normal(size=v.shape).astype(np.float32) for v in model.trainable_variables]
    loop = client_training.build_phased_loop(
        model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), 0.5,
        [client_training.Phase((1, 2), EPOCHS)])
    out = loop(tff.learning.models.ModelWeights(trainable=[w, h, b],
                                                non_trainable=non_trainable), dataset)
    # Inference-mode batch normalization, from Ioffe & Szegedy (2015), Alg. 2: the moving
    # statistics, not the batch's: γ·(z − μ)/√(σ² + ε) + β.
    stats = {k: np.asarray(v, np.float64) for k, v in bn_stats.items()}
    z = x.astype(np.float64) @ w
    z_bn = (stats["gamma"] * (z - stats["moving_mean"]) / np.sqrt(stats["moving_variance"] + 0.01)
            + stats["beta"])
    h_np, b_np, loss_np = _numpy_head_sgd(z_bn, y, np.eye(Z), h.astype(np.float64),
                                          b.astype(np.float64))
    np.testing.assert_allclose(out["trainable"][1], h_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["trainable"][2], b_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["loss_sum"], loss_np, rtol=1e-5)
    assert float(model.get_layer("count").calls.numpy()) == len(SIZES)  # one body pass
    bn = model.get_layer("bn")
    np.testing.assert_allclose(bn.moving_mean.numpy(), bn_stats["moving_mean"])  # not updated
    bn.trainable = True
    assert feature_cache.stochastic_layers(model) == ["bn"]


class _SelfDropout(tf.keras.layers.Layer):
    """Dropout applied with `tf.nn.dropout`, no Dropout sublayer: only its `dropout` says so."""

    def __init__(self, dropout, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout

    def call(self, x, training=None):
        return tf.nn.dropout(x, self.dropout) if training and self.dropout else x


def test_a_layer_with_a_positive_dropout_attribute_is_stochastic():
    assert feature_cache.stochastic_layers(_SelfDropout(0.3, name="own")) == ["own"]
    assert feature_cache.stochastic_layers(_SelfDropout(0.0)) == []
    inputs = tf.keras.Input((Z,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(C, name="head")(
        _SelfDropout(0.3, name="own")(inputs)))
    assert feature_cache.head_split(model, [model.get_layer("head").kernel]) is None
