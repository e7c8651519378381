"""Shared builders of the federated-LoRA tests (test_lora_fl, test_flora, test_flexlora,
test_lora_fl_theory): a linear LoRA layer, its numpy replica and a small problem.

The test model is linear, y = x·W0 + x·A·B (W0 frozen, A `lora_a`, B `lora_b`), with the Keras
MSE loss ℓ = (1/(n·d_out)) Σ (ŷ − y)² per batch, whose gradients numpy computes by hand:
G = (2/(n·d_out))·(ŷ − y), ∇_B ℓ = (x·A)ᵀ·G, ∇_A ℓ = xᵀ·G·Bᵀ.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from models.paper_models import LowRankDense
from tffl.algorithms import lora_fl
from tffl.engine import roles


class LinearLora(tf.keras.layers.Layer):
    """y = x·W0 + x·A·B with W0 (d_in×d_out, frozen), A (d_in×r, lora_a), B (r×d_out, lora_b)."""

    def __init__(self, w0, a0, scale=1.0, link=False, **kwargs):
        super().__init__(**kwargs)
        self.w0, self.a0 = np.asarray(w0, np.float32), np.asarray(a0, np.float32)
        self.scale, self.link = scale, link

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=self.w0.shape, trainable=False,
                                      initializer=tf.constant_initializer(self.w0))
        self.lora_a = self.add_weight(name="lora_a", shape=self.a0.shape,
                                      initializer=tf.constant_initializer(self.a0))
        self.lora_b = self.add_weight(name="lora_b", shape=(self.a0.shape[1], self.w0.shape[1]),
                                      initializer="zeros")
        roles.tag(self.kernel, roles.FROZEN)
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)
        if self.link:
            roles.link_lora(self.lora_a, self.lora_b, self.kernel, self.scale)

    def call(self, x):
        return tf.matmul(x, self.kernel) + self.scale * tf.matmul(tf.matmul(x, self.lora_a),
                                                                  self.lora_b)


def linear_model_fn(layers, **kwargs):
    """Builder of a stack of `LinearLora` layers given as [(w0, a0), ...]; `kwargs` go to each."""

    def build():
        x = tf.keras.Input((layers[0][0].shape[0],))
        y = x
        for k, (w0, a0) in enumerate(layers):
            y = LinearLora(w0, a0, name=f"lora_{k}", **kwargs)(y)
        return tf.keras.Model(x, y)

    return build


def linear_spec(d_in, d_out):
    return (tf.TensorSpec([None, d_in], tf.float32), tf.TensorSpec([None, d_out], tf.float32))


def client_datasets(clients, batch_size):
    return [tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size) for x, y in clients]


def local_sgd(a, b, w0, x, y, lr, batch_size, train, scale=1.0):
    """Independent numpy replica of one client's pass: SGD on the factors named in `train`, for
    ŷ = x·W0 + scale·x·A·B."""
    a, b = a.astype(np.float64).copy(), b.astype(np.float64).copy()
    for s in range(0, len(x), batch_size):
        xb, yb = x[s:s + batch_size].astype(np.float64), y[s:s + batch_size].astype(np.float64)
        g = 2.0 / yb.size * (xb @ w0 + scale * xb @ a @ b - yb)
        grad_a, grad_b = scale * xb.T @ g @ b.T, scale * (xb @ a).T @ g
        if "a" in train:
            a = a - lr * grad_a
        if "b" in train:
            b = b - lr * grad_b
    return a, b


def weighted_mean(values, counts):
    counts = np.asarray(counts, np.float64)
    return sum(c * v for c, v in zip(counts, values)) / counts.sum()


# A small problem shared by the exactness tests: d_in=4, d_out=3, r=2, three clients of unequal size
# (4, 6, 2 examples; batch 2, so 2, 3 and 1 local steps), weighted mean by examples.
RNG = np.random.default_rng(0)
D_IN, D_OUT, R = 4, 3, 2
W0 = RNG.normal(size=(D_IN, D_OUT)).astype(np.float32)
A0 = RNG.normal(size=(D_IN, R)).astype(np.float32)
B0 = (0.5 * RNG.normal(size=(R, D_OUT))).astype(np.float32)  # set as a non-zero start
CLIENTS = [(RNG.normal(size=(n, D_IN)).astype(np.float32),
             RNG.normal(size=(n, D_OUT)).astype(np.float32)) for n in (4, 6, 2)]
COUNTS = [len(x) for x, _ in CLIENTS]
LR, BATCH = 0.1, 2


def small_process(name, **kwargs):
    return lora_fl.build_lora_process(
        name, linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), LR,
        loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


def start(process, b0=B0):
    """Initial state with B set to `b0` (tests `with_model_weights` and a non-zero B start)."""
    state = process.initialize()
    weights = process.model_weights(state)   # the whole model: [A, B] trainable, [W0] frozen
    np.testing.assert_array_equal(weights.trainable[0], A0)
    np.testing.assert_array_equal(weights.trainable[1], np.zeros((R, D_OUT)))
    np.testing.assert_array_equal(weights.non_trainable[0], W0)
    weights = tff.learning.models.ModelWeights(
        trainable=[weights.trainable[0], b0], non_trainable=weights.non_trainable)
    state = process.with_model_weights(state, weights)
    set_weights = process.model_weights(state)
    np.testing.assert_array_equal(set_weights.trainable[1], b0)
    np.testing.assert_array_equal(set_weights.trainable[0], A0)
    np.testing.assert_array_equal(set_weights.non_trainable[0], W0)
    return state


def run(process, state, datasets, calls):
    """`calls` calls of `next` (one communication round each) on the same `datasets`; returns the
    last state and the list of each call's metrics."""
    metrics = []
    for _ in range(calls):
        state, round_metrics = process.next_round(state, datasets)
        metrics.append(round_metrics)
    return state, metrics

def client_factors_by_fedavg(fedavg, a, b, datasets):
    """Each client's trained (A_i, B_i) from (a, b), read off a FedAvg-LoRA round on that client
    alone (its mean is A + ΔA_i = A_i): the same client training, none of FlexLoRA's server
    math (stacking, SVD)."""
    factors = []
    for dataset in datasets:
        state = fedavg.initialize()
        weights = fedavg.get_model_weights(state)
        state = fedavg.set_model_weights(state, tff.learning.models.ModelWeights(
            trainable=[np.asarray(a, np.float32), np.asarray(b, np.float32)],
            non_trainable=weights.non_trainable))
        trained = fedavg.get_model_weights(fedavg.next(state, [dataset]).state).trainable
        factors.append(tuple(np.asarray(v, np.float64) for v in trained))
    return factors


def check_flexlora_round(a, b, factors, counts, a_new, b_new, atol=1e-6):
    """FlexLoRA's round with the product-upload formula (numpy, float64): P = A·B +
    Σ p_i(A_iB_i − A·B), p_i = n_i/Σn, P = U S Vᵀ; the new A·B is U_r S_r V_rᵀ (r = A's columns)
    and A, B are the √-split, so the singular values of both are √s_1..√s_r."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    p = np.asarray(counts, np.float64) / np.sum(counts)
    product = a @ b + sum(pi * (ai @ bi - a @ b) for pi, (ai, bi) in zip(p, factors))
    u, s, vt = np.linalg.svd(product)
    r = a.shape[1]
    a_new, b_new = np.asarray(a_new, np.float64), np.asarray(b_new, np.float64)
    np.testing.assert_allclose(a_new @ b_new, (u[:, :r] * s[:r]) @ vt[:r], rtol=1e-6, atol=atol)
    for factor in (a_new, b_new):
        np.testing.assert_allclose(np.linalg.svd(factor, compute_uv=False), np.sqrt(s[:r]),
                                   rtol=1e-6, atol=atol)
    return s


def two_layer(d_in, d_hidden, d_out, r, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(d_in, d_hidden)), rng.normal(size=(d_in, r))),
            (rng.normal(size=(d_hidden, d_out)), rng.normal(size=(d_hidden, r)))]

def row_mse():
    return lambda y, p: tf.reduce_mean(tf.reduce_sum(tf.square(y - p), axis=-1))

def lora_with_head():
    """x (12) → LowRankDense(6, rank 2) [A: lora_a, B: lora_b] → Dense(3) logits [role head]."""
    x = tf.keras.Input((12,))
    head = tf.keras.layers.Dense(3, name="head")
    logits = head(LowRankDense(6, 2, stddev=0.5, seed=0, name="lora")(x))
    roles.tag_layer(head, roles.HEAD)
    return tf.keras.Model(x, logits)
