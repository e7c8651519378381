"""RoLoRA's linear Algorithm 2 (Alt-min-GD) exactly as stated (rolora.md §2.1), as TFF rounds.

Client i holds X_i ∈ R^{m_i×d} and Y_i ∈ R^{m_i×d}; the model is f_i(X) = X a bᵀ with a a unit
vector, and l_i(a, b) = (1/m_i)‖Y_i − X_i a bᵀ‖²_F. One iteration t (one `next`, two
communication exchanges, `tffl.engine.linear_engine.build_two_exchange_round`: b, then a's gradient):

1. the server broadcasts a = a^{t−1};
2. client i solves b exactly: b̃_i = argmin_b l_i(a, b) = Y_iᵀ X_i a / ‖X_i a‖²;
3. the server averages b̄ = (1/N) Σ_i b̃_i and broadcasts it;
4. client i returns ∇_a l_i(a, b̄) = (2/m_i)(X_iᵀX_i a b̄ᵀb̄ − X_iᵀY_i b̄);
5. the server takes one gradient step and normalizes: â⁺ = a − η (1/N) Σ_i ∇_a l_i(a, b̄),
   a^t = â⁺/‖â⁺‖; b^t = b̄.

Initialization: a⁰ a seeded random unit vector (or `with_a`), b⁰ = 0. Clients send b̃_i and a
gradient, never run local GD on a (unlike `tffl.algorithms.lora_fl`'s RoLoRA with K local steps, the LLM
version of the same alternation; both are tested on `tasks.synthetic.rolora_linear`). Averages
are unweighted (1/N), as in the algorithm. The server state and both exchanges are d floats.

Types: state TFF's `LearningAlgorithmState(global_model_weights=OrderedDict(a=float32[d],
b=float32[d]), distributor=(), client_work=(), aggregator=(), finalizer=OrderedDict(
round_num=int32))`@SERVER, as every process's of the engine; client data
`OrderedDict(x=float32[None, d], y=float32[None, d])`@CLIENTS; metrics in TFF's structure,
`client_work/train`: `loss` = (1/N) Σ_i l_i(a^{t−1}, b̄) and `num_clients`. The algebra runs in
float64 inside the computations.

The process. `build_rolora_alt_min_gd` returns a `tffl.engine.process.Process`, a TFF
`LearningProcess` whose model weights are the pair `OrderedDict(a=float32[d], b=float32[d])`
(ΔW = a bᵀ, the whole model): `get_model_weights(state)` is (a, b); `set_model_weights(state,
(a, b))` stores a/‖a‖ and ‖a‖·b, the same ΔW with a a unit vector, as the algorithm keeps it
(a must be non-zero). `next_round` checks the data (x and y both (m, d), at least one client).
Its `config` is an `AltMinGDConfig`. The module's functions: `get_a(state)`, `get_b(state)` and
`with_a(process, state, a)` (a replaced by a/‖a‖, b kept).

Example:

>>> process = build_rolora_alt_min_gd(dim=10, learning_rate=0.5, seed=0)
>>> a_star, b_star = np.eye(10, dtype=np.float32)[0], np.full(10, 10**-0.5, np.float32)
>>> clients = [dict(x=x, y=np.outer(x @ a_star, b_star)) for x in xs]   # Y_i = X_i a* b*ᵀ
>>> with runtime.local_runtime():
...     state = process.initialize()
...     for _ in range(30):
...         state = process.next_round(state, clients).state
>>> a = get_a(state)
>>> round(float(np.linalg.norm(a)), 4), round(abs(float(a @ a_star)), 3)   # unit, |⟨a, a*⟩|
(1.0, 1.0)
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import linear_engine
from tffl.engine import process as process_lib

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


def _data_type(dim: int) -> tff.StructWithPythonType:
    return tff.StructWithPythonType(
        [("x", tff.TensorType(np.float32, [None, dim])),
         ("y", tff.TensorType(np.float32, [None, dim]))], collections.OrderedDict)


def _state(a, b, round_num, like=None):
    """The state with weights (a, b) and `round_num` (inside a TF computation, or in Python on
    numpy values); distributor, client work and aggregator `like`'s (default empty)."""
    members = (((), (), ()) if like is None
               else (like.distributor, like.client_work, like.aggregator))
    return LearningAlgorithmState(collections.OrderedDict(a=a, b=b), *members,
                                  collections.OrderedDict(round_num=round_num))


@dataclasses.dataclass(frozen=True)
class AltMinGDConfig:
    """RoLoRA's Alt-min-GD configuration (a process's `config`): d, η and the seed of a⁰."""

    dim: int
    learning_rate: float
    seed: int


def get_a(state) -> np.ndarray:
    """a (float32[d], a unit vector) of a state."""
    return np.asarray(state.global_model_weights["a"])


def get_b(state) -> np.ndarray:
    """b (float32[d]) of a state."""
    return np.asarray(state.global_model_weights["b"])


def with_a(process: process_lib.Process, state, a) -> LearningAlgorithmState:
    """`state` with a replaced by the unit vector a/‖a‖ (b and round_num kept)."""
    dim = process.config.dim
    a = np.asarray(a, np.float64).reshape(-1)
    if a.shape != (dim,) or not np.linalg.norm(a) > 0:
        raise ValueError(f"a must be a non-zero vector of length d={dim}")
    return _state((a / np.linalg.norm(a)).astype(np.float32), get_b(state),
                  state.finalizer["round_num"], like=state)


def _weights_computations(state_type, vector):
    """(get_model_weights, set_model_weights): S -> (a, b) and <S, (a, b)> -> S with
    (a/‖a‖, ‖a‖·b), round_num kept."""
    weights_type = tff.StructWithPythonType([("a", vector), ("b", vector)],
                                            collections.OrderedDict)

    @tff.tensorflow.computation(state_type)
    def get_weights(state):
        return state.global_model_weights

    @tff.tensorflow.computation(state_type, weights_type)
    def set_weights(state, weights):
        a, b = tf.cast(weights["a"], tf.float64), tf.cast(weights["b"], tf.float64)
        norm = tf.norm(a)
        return _state(tf.cast(a / norm, tf.float32), tf.cast(norm * b, tf.float32),
                      state.finalizer["round_num"], like=state)

    return get_weights, set_weights


def build_rolora_alt_min_gd(dim: int, learning_rate: float, seed: int = 0
                            ) -> process_lib.Process:
    """RoLoRA's Algorithm 2 (module docstring) for rank-1 ΔW = a bᵀ ∈ R^{d×d}; η = `learning_rate`
    (the theory needs η ≤ 1/L_max², L_max ≥ ‖b*‖). Returns the stateless `Process` (module
    docstring); `config` an `AltMinGDConfig`."""
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"dim={dim} must be >= 1")
    eta = linear_engine.check_rate("learning_rate", learning_rate)
    data_type = _data_type(dim)
    vector = tff.TensorType(np.float32, [dim])

    @tff.tensorflow.computation
    def initial_state():
        a = tf.random.stateless_normal([dim], seed=[int(seed), 0x401A], dtype=tf.float64)
        return _state(tf.cast(a / tf.norm(a), tf.float32), tf.zeros([dim], tf.float32),
                      tf.constant(0, tf.int32))

    state_type = initial_state.type_signature.result

    @tff.tensorflow.computation(vector, data_type)
    def solve_b(a, data):
        x, y = tf.cast(data["x"], tf.float64), tf.cast(data["y"], tf.float64)
        xa = tf.linalg.matvec(x, tf.cast(a, tf.float64))                   # X a  (m,)
        b = tf.linalg.matvec(y, xa, transpose_a=True) / tf.reduce_sum(xa * xa)   # Yᵀ X a / ‖Xa‖²
        return tf.cast(b, tf.float32)

    @tff.tensorflow.computation(vector, vector, data_type)
    def gradient_a(a, b, data):
        x, y = tf.cast(data["x"], tf.float64), tf.cast(data["y"], tf.float64)
        a64, b64 = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
        m = tf.cast(tf.shape(x)[0], tf.float64)
        xa = tf.linalg.matvec(x, a64)
        residual = y - xa[:, None] * b64[None, :]                          # Y − X a bᵀ
        grad = (2.0 / m) * (tf.linalg.matvec(x, xa, transpose_a=True) * tf.reduce_sum(b64 * b64)
                            - tf.linalg.matvec(tf.matmul(x, y, transpose_a=True), b64))
        loss = tf.reduce_sum(residual * residual) / m
        return collections.OrderedDict(value=tf.cast(grad, tf.float32),
                                       loss=tf.cast(loss, tf.float32))

    @tff.tensorflow.computation(state_type)
    def broadcast_a(state):
        return state.global_model_weights["a"]

    @tff.tensorflow.computation(state_type, vector, vector)
    def step(state, b_bar, mean_gradient):
        a = (tf.cast(state.global_model_weights["a"], tf.float64)
             - eta * tf.cast(mean_gradient, tf.float64))
        return _state(tf.cast(a / tf.norm(a), tf.float32), b_bar,
                      state.finalizer["round_num"] + 1, like=state)

    next_fn = linear_engine.build_two_exchange_round(state_type, data_type, broadcast_a,
                                                     solve_b, gradient_a, step)
    get_weights, set_weights = _weights_computations(state_type, vector)
    return linear_engine.build_process(
        "rolora_linear", linear_engine.initialize_at_server(initial_state), next_fn,
        get_model_weights=get_weights, set_model_weights=set_weights,
        config=AltMinGDConfig(dim=dim, learning_rate=eta, seed=int(seed)),
        check_data=linear_engine.data_checker(dim, "RoLoRA Alt-min-GD", target_dims=2),
        traffic=linear_engine.two_exchange_traffic(broadcast_a, solve_b, gradient_a))
