"""The linear algorithms' basics (`tffl.engine.linear_engine` has the model, the server and the
averaging round): argument checks at build time, the float64 algebra inside their
`tff.tensorflow.computation`s, the round kinds' client results and train metrics, their client
data and personal-state types, and the Python side of the personal state.

>>> check_dims(10, 2), check_rate("learning_rate", 0.5)
((10, 2), 0.5)
>>> q = orthonormalize(gaussian(5, 2, seed=0)).numpy()
>>> bool(np.allclose(q.T @ q, np.eye(2)))
True
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine.personal_state import PersonalSpec


# Argument checks (Python, at build time).

def check_dims(dim: int, rank: int) -> tuple[int, int]:
    """(d, k) as ints; ValueError unless d >= 1 and 1 <= k <= d (the message names the value)."""
    dim, rank = int(dim), int(rank)
    if dim < 1:
        raise ValueError(f"dim={dim} must be >= 1")
    if not 1 <= rank <= dim:
        raise ValueError(f"rank={rank} must satisfy 1 <= rank <= dim={dim}")
    return dim, rank


def check_rate(name: str, value: float, allow_zero: bool = False) -> float:
    """`value` as a float; ValueError unless finite and > 0 (>= 0 with `allow_zero`)."""
    value = float(value)
    if not (np.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name}={value} must be a finite number {'>=' if allow_zero else '>'} 0")
    return value


def data_checker(dim: int, algorithm: str, target_dims: int = 1) -> Callable[[Any], None]:
    """`client_data -> None` (a process's `check_data`): ValueError unless there is at least one
    client and every client's x is (m, d) and y is (m,) (`target_dims` 1) or (m, d) (2), m >= 1."""

    def check(client_data) -> None:
        if len(client_data) == 0:
            raise ValueError(f"{algorithm} needs at least one client")
        for i, item in enumerate(client_data):
            x, y = np.shape(item["x"]), np.shape(item["y"])
            if len(x) == 2 and x[1] == dim and x[0] >= 1 and y == x[:target_dims]:
                continue
            raise ValueError(f"client {i}: x {x} and y {y} must both be (m, d={dim}) with m >= 1"
                             if target_dims == 2 else f"client {i}: expected x of shape (m, "
                             f"{dim}) and y of shape (m,) with m >= 1, got {x} and {y}")

    return check


# Float64 algebra (TensorFlow, inside `tff.tensorflow.computation`s).

def orthonormalize(b: tf.Tensor) -> tf.Tensor:
    """Q of the thin QR b = QR (d×k), column signs fixed so that diag(R) >= 0."""
    q, r = tf.linalg.qr(b)
    diag = tf.linalg.diag_part(r)
    signs = tf.where(diag < 0, -tf.ones_like(diag), tf.ones_like(diag))
    return q * signs[tf.newaxis, :]


def gaussian(dim: int, rank: int, seed: int, stream: int = 0) -> tf.Tensor:
    """A float64 d×k matrix of i.i.d. N(0, 1) entries, seeded by (seed, stream)."""
    return tf.random.stateless_normal([dim, rank], seed=[int(seed), int(stream)],
                                      dtype=tf.float64)


def batch64(data) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(X, y, m) of one client's `OrderedDict(x, y)`: X (m×d), y (m,) and m, all float64."""
    x64, y64 = tf.cast(data["x"], tf.float64), tf.cast(data["y"], tf.float64)
    return x64, y64, tf.cast(tf.shape(x64)[0], tf.float64)


# The round kinds' client results and metrics (inside their TF computations).

def client_result(upload, loss, personal=None):
    """A linear client's output as the engine's client work returns it (`tffl.engine.rounds.
    RoundPieces.client_update`): (`ClientResult(upload, 1)` (float32; `upload` any structure),
    metric sums {loss_sum: ℓ_i, num_clients: 1}, the new personal state, or [] for a process
    without one). Inside a TF computation."""
    upload = tf.nest.map_structure(lambda v: tf.cast(v, tf.float32), upload)
    result = tff.learning.templates.ClientResult(update=upload,
                                                 update_weight=tf.constant(1.0, tf.float32))
    sums = collections.OrderedDict(loss_sum=tf.cast(loss, tf.float32),
                                   num_clients=tf.constant(1, tf.int32))
    return result, sums, ([] if personal is None else personal)


def linear_train_metrics(sums):
    """Σ_i (ℓ_i, 1) -> `client_work/train` {loss: (1/n) Σ_i ℓ_i, num_clients: n} (a linear
    round kind's `RoundPieces.finalize_metrics`)."""
    n = sums["num_clients"]
    return collections.OrderedDict(loss=sums["loss_sum"] / tf.cast(n, tf.float32),
                                   num_clients=n)


# TFF types.

def data_type(dim: int) -> tff.StructWithPythonType:
    """One client's data: `OrderedDict(x=float32[None, d], y=float32[None])`."""
    return tff.StructWithPythonType(
        [("x", tff.TensorType(np.float32, [None, dim])), ("y", tff.TensorType(np.float32, [None]))],
        collections.OrderedDict,
    )


def personal_type(shapes: Mapping[str, Sequence[int]]) -> tff.StructWithPythonType:
    """One client's personal state: `OrderedDict(name=float32[shape], …)`, in `shapes`' order."""
    return tff.StructWithPythonType(
        [(name, tff.TensorType(np.float32, list(shape))) for name, shape in shapes.items()],
        collections.OrderedDict,
    )


# The personal state, Python side.

def personal_spec(shapes: Mapping[str, Sequence[int]],
                  initial: Callable[[str], Any]) -> PersonalSpec:
    """One client's personal state `OrderedDict(name=float32[shape], …)` (`personal_type`'s),
    starting at `initial(client_id)`."""
    return PersonalSpec(
        names=tuple(shapes), shapes=tuple(tuple(s) for s in shapes.values()),
        dtypes=(np.float32,) * len(shapes), initial=initial, keyed=True)


def stack_personal(personal_states, name: str) -> np.ndarray:
    """The clients' `name` entries stacked as rows (M×size, float64)."""
    return np.stack([np.asarray(p[name], np.float64) for p in personal_states])
