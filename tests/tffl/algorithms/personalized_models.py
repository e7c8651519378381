"""The models and data the tests of the personalized algorithms share (test_personalized,
test_flute, test_adaptpfl, test_keras_nlp_task_models, tests/tffl/test_production.py and the
distribute parity child).

The linear model is f(x) = x·W·h with W (d×k, role `shared`) the representation and h (k×1,
role `head`) the personal head, loss L = mean_n (x_n W h − y_n)², so

    ∇_h L = (2/n) (XW)ᵀ r,   ∇_W L = (2/n) Xᵀ r hᵀ,   r = XWh − y,

and every client dataset is one full batch, so an epoch is one gradient step. The classifier
is x -> x·W (role shared) -> x·W·H + b (M classes, role head), optionally mixed with a personal
shortcut x·S (AdaptPFL).
"""

import functools

import numpy as np
import tensorflow as tf

from tffl.algorithms import personalized
from tffl.engine import roles

D, K = 4, 2
SPEC = (tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None, 1], tf.float32))
LR = 0.05


def linear_model(head=True, representation=True):
    """x (D) -> x·W (K, role shared) -> x·W·h (1, role head), no biases."""
    inputs = tf.keras.Input((D,))
    rep = tf.keras.layers.Dense(K, use_bias=False, name="rep",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    out = tf.keras.layers.Dense(1, use_bias=False, name="out",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    model = tf.keras.Model(inputs, out(rep(inputs)))
    if representation:
        roles.tag_layer(rep, roles.SHARED)
    else:
        rep.trainable = False
        roles.tag_layer(rep, roles.FROZEN)
    if head:
        roles.tag_layer(out, roles.HEAD)
    return model


def build(algorithm, **kwargs):
    """`algorithm`'s personalized process on `linear_model` with the squared error."""
    return personalized.build_personalized_process(
        algorithm, linear_model, SPEC, LR, loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


@functools.cache
def built(algorithm):
    """`build(algorithm)`, built once per test process and shared: a process holds no state (its
    computations are pure functions of their arguments)."""
    return build(algorithm)


def linear_clients(sizes=(5, 8, 3), seed=0):
    """One (x, y) pair of arrays per client, standard normal, `sizes` examples each."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, D)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32))
            for n in sizes]


def full_batch_datasets(clients):
    """Each client's (x, y) as one full batch (linear or classification clients): an epoch is one
    gradient step."""
    return [tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)) for x, y in clients]


def grads(x, y, w, h):
    """(∇_W L, ∇_h L) of the squared error of the linear model (the module docstring)."""
    r = x @ w @ h - y
    n = len(x)
    return 2 / n * x.T @ r @ h.T, 2 / n * (x @ w).T @ r


def numpy_round(algorithm, clients, w, heads, tau_h=1, tau_r=1, epochs=1):
    """One round in float64: (new W, new heads, client losses of the last phase)."""
    new_w, new_heads, counts = [], [], []
    for (x, y), h in zip(clients, heads):
        x, y = x.astype(np.float64), y.astype(np.float64)
        wi, hi = w.copy(), h.copy()
        if algorithm == "fedrep":
            for _ in range(tau_h):
                hi = hi - LR * grads(x, y, wi, hi)[1]
            for _ in range(tau_r):
                wi = wi - LR * grads(x, y, wi, hi)[0]
        else:  # joint (FedPer, LG-FedAvg, FedAvg)
            for _ in range(epochs):
                gw, gh = grads(x, y, wi, hi)
                wi, hi = wi - LR * gw, hi - LR * gh
        new_w.append(wi)
        new_heads.append(hi)
        counts.append(len(x))
    counts = np.array(counts, float)
    w_bar = w + sum(c * (wi - w) for c, wi in zip(counts, new_w)) / counts.sum()
    return w_bar, new_heads


def initial_weights(process):
    """(W, h) of the whole initial model (`model_weights`: the federated W, and the model's
    initial head at the personal position for the processes that keep the head personal)."""
    weights = process.model_weights(process.initialize())
    return np.asarray(weights.trainable[0], np.float64), np.asarray(weights.trainable[1],
                                                                    np.float64)


M = 3  # classes


def numpy_nc(h, u):
    """Independent numpy NC_i(H) = ‖HᵀH/‖HᵀH‖_F − (1/√(m−1)) (uuᵀ) ⊙ (I − 11ᵀ/m)‖_F."""
    m = h.shape[1]
    gram = h.T @ h
    gram = gram / np.sqrt(np.sum(gram**2) + 1e-12)
    target = np.outer(u, u) * (np.eye(m) - np.ones((m, m)) / m) / np.sqrt(m - 1)
    return np.sqrt(np.sum((gram - target) ** 2) + 1e-12)




def classifier(shortcut_alpha=None):
    """x (D) -> features x·W (K, role shared) -> logits = features·H + b (M, role head)."""
    inputs = tf.keras.Input((D,))
    rep = tf.keras.layers.Dense(K, use_bias=False, name="rep",
                                kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(M, name="head",
                                 kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    logits = head(rep(inputs))
    roles.tag_layer(rep, roles.SHARED)
    roles.tag_layer(head, roles.HEAD)
    if shortcut_alpha is not None:
        from models import paper_models

        shortcut = tf.keras.layers.Dense(M, use_bias=False, name="shortcut",
                                         kernel_initializer="zeros")
        logits = paper_models.ShortcutMix(shortcut_alpha)([logits, shortcut(inputs)])
        roles.tag_layer(shortcut, roles.SHORTCUT)
    return tf.keras.Model(inputs, logits)


CLASS_SPEC = (tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None], tf.int32))


def class_clients(seed, sizes=(6, 5)):
    """Two classification clients of `classifier`'s inputs."""
    rng = np.random.default_rng(seed)
    # Client 0 holds classes {0, 1}, client 1 classes {1, 2}.
    return [(rng.normal(size=(n, D)).astype(np.float32),
             (rng.integers(0, 2, n) + i).astype(np.int32)) for i, n in enumerate(sizes)]



def numeric_grad(f, params, name, eps=1e-6):
    """The central finite-difference gradient of `f(params)` with respect to `params[name]`."""
    value = params[name]
    grad = np.zeros_like(value)
    for idx in np.ndindex(*value.shape):
        up = dict(params)
        down = dict(params)
        step = np.zeros_like(value)
        step[idx] = eps
        up[name], down[name] = value + step, value - step
        grad[idx] = (f(up) - f(down)) / (2 * eps)
    return grad


def lora_classifier():
    """A 1-layer KerasNLP BERT (hidden 8, vocabulary 50, sequences of 8) with rank-2 LoRA on its
    query and value, everything else frozen, and a 3-class head."""
    from models import backbones
    from models import lora_targets

    backbone = backbones.build_bert_backbone(vocabulary_size=50, num_layers=1, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=8)
    lora_targets.apply_lora(backbone, lora_targets.LoraConfig(rank=2, targets=("query", "value")))
    lora_targets.freeze_non_lora(backbone)
    return backbones.build_classifier(backbone, num_classes=3)
