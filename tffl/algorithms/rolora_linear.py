"""RoLoRA's linear Algorithm 2 (Alt-min-GD) exactly as stated (rolora.md §2.1), as the engine's
round kinds and schedule.

Client i holds X_i ∈ R^{m_i×d} and Y_i ∈ R^{m_i×d}; the model is f_i(X) = X a bᵀ with a a unit
vector, and l_i(a, b) = (1/m_i)‖Y_i − X_i a bᵀ‖²_F. One iteration t is two communication rounds,
the B round then the A round, as RoLoRA's Keras rounds (`tffl.algorithms.lora_plans`):

1. `b_round`: the server broadcasts (a, b) = (a^{t−1}, b^{t−1}); client i solves b exactly,
   b̃_i = argmin_b l_i(a, b) = Y_iᵀ X_i a / ‖X_i a‖², and uploads it; the server keeps
   b̄ = (1/n) Σ_i b̃_i;
2. `a_round`: the server broadcasts (a, b̄); client i uploads
   ∇_a l_i(a, b̄) = (2/m_i)(X_iᵀX_i a b̄ᵀb̄ − X_iᵀY_i b̄);
3. the server takes one gradient step and normalizes: â⁺ = a − η (1/n) Σ_i ∇_a l_i(a, b̄),
   a^t = â⁺/‖â⁺‖; b^t = b̄.

Each round kind is TFF's four pieces (broadcast of (a, b), the client computation, the unweighted
mean `tff.aggregators.UnweightedMeanFactory`, the server step) composed by the engine's one
composer (`tffl.engine.process.build_process`); the schedule alternates them
(`tffl.engine.schedules.alternating`). TFF's `next` is one iteration, both rounds on the same
clients' data (`shared_cycle_data`: the A round's gradient is taken on the clients that solved
b̄, as the algorithm has it); `next_round` runs one communication round, so
`tffl.simulation.driver.run_rounds(rounds=)` counts 2 per iteration. Run that way, it is Algorithm 2
with full participation and the same data every round; under partial participation the driver
samples each round anew, as for every algorithm, which Algorithm 2 (all N clients) does not do.

Initialization: a⁰ a seeded random unit vector (or `with_a`), b⁰ = 0. Clients send b̃_i and a
gradient, never run local GD on a (unlike `tffl.algorithms.lora_fl`'s RoLoRA with K local steps,
the LLM version of the same alternation; both are tested on `tasks.synthetic.rolora_linear`).
Averages are unweighted (1/n), as in the algorithm. Each round broadcasts 2d floats and uploads
d (and the update's weight, the loss and the client count); bytes per client are read off TFF's
forms.

Types: state TFF's `LearningAlgorithmState(global_model_weights=OrderedDict(a=float32[d],
b=float32[d]), distributor=(), client_work=(), aggregator={b_round: ((), ()), a_round: ((), ())},
finalizer={round_num: int32, steps: {b_round: {}, a_round: {}}})`@SERVER, as every process's of
the engine (round_num counts communication rounds); client data `OrderedDict(x=float32[None, d],
y=float32[None, d])`@CLIENTS; metrics in TFF's structure, `client_work/train`: `loss` =
(1/n) Σ_i l_i at the round's start (the B round: l_i(a^{t−1}, b^{t−1}); the A round:
l_i(a^{t−1}, b̄)) and `num_clients`; `next`'s are the two rounds' mean. The algebra runs in
float64 inside the computations.

The process. `build_rolora_alt_min_gd` returns a `tffl.engine.process.Process`, a TFF
`LearningProcess` whose model weights are the pair `OrderedDict(a=float32[d], b=float32[d])`
(ΔW = a bᵀ, the whole model): `get_model_weights(state)` is (a, b); `set_model_weights(state,
(a, b))` stores a/‖a‖ and ‖a‖·b, the same ΔW with a a unit vector, as the algorithm keeps it
(a must be non-zero). `next_round` checks the data (x and y both (m, d), at least one client).
Its `config` is an `AltMinGDConfig`. The module's functions: `get_a(state)`, `get_b(state)` and
`with_a(process, state, a)` (a replaced by a/‖a‖, b kept).

Example (`next`: one iteration, both rounds on the same clients):

>>> process = build_rolora_alt_min_gd(dim=10, learning_rate=0.5, seed=0)
>>> a_star, b_star = np.eye(10, dtype=np.float32)[0], np.full(10, 10**-0.5, np.float32)
>>> clients = [dict(x=x, y=np.outer(x @ a_star, b_star)) for x in xs]   # Y_i = X_i a* b*ᵀ
>>> with runtime.local_runtime():
...     state = process.initialize()
...     for _ in range(30):
...         state = process.next(state, clients).state
>>> a = get_a(state)
>>> round(float(np.linalg.norm(a)), 4), round(abs(float(a @ a_star)), 3)   # unit, |⟨a, a*⟩|
(1.0, 1.0)
>>> process.round_name(state), process.round_num(state)          # 30 iterations, 60 rounds
('b_round', 60)
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import linear_basics
from tffl.engine import linear_engine
from tffl.engine import process as process_lib
from tffl.engine import rounds
from tffl.engine import schedules

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState
B_ROUND, A_ROUND = "b_round", "a_round"


def _data_type(dim: int) -> tff.StructWithPythonType:
    return tff.StructWithPythonType(
        [("x", tff.TensorType(np.float32, [None, dim])),
         ("y", tff.TensorType(np.float32, [None, dim]))], collections.OrderedDict)


def _weights_type(dim: int) -> tff.StructWithPythonType:
    vector = tff.TensorType(np.float32, [dim])
    return tff.StructWithPythonType([("a", vector), ("b", vector)], collections.OrderedDict)


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


def _with_weights(state, weights) -> LearningAlgorithmState:
    """`state` with model weights `weights`, the rest kept (TF or numpy values)."""
    return LearningAlgorithmState(weights, state.distributor, state.client_work,
                                  state.aggregator, state.finalizer)


def with_a(process: process_lib.Process, state, a) -> LearningAlgorithmState:
    """`state` with a replaced by the unit vector a/‖a‖ (b and round_num kept)."""
    dim = process.config.dim
    a = np.asarray(a, np.float64).reshape(-1)
    if a.shape != (dim,) or not np.linalg.norm(a) > 0:
        raise ValueError(f"a must be a non-zero vector of length d={dim}")
    unit = (a / np.linalg.norm(a)).astype(np.float32)
    return _with_weights(state, collections.OrderedDict(a=unit, b=get_b(state)))


def _unit_a(weights):
    """(a/‖a‖, ‖a‖·b): the same a bᵀ with a unit a, as `set_model_weights` stores it (TF)."""
    a, b = tf.cast(weights["a"], tf.float64), tf.cast(weights["b"], tf.float64)
    norm = tf.norm(a)
    return collections.OrderedDict(a=tf.cast(a / norm, tf.float32),
                                   b=tf.cast(norm * b, tf.float32))


def _loss(x, y, a, b):
    """l_i(a, b) = (1/m)‖Y − X a bᵀ‖²_F (float64)."""
    residual = y - tf.linalg.matvec(x, a)[:, None] * b[None, :]
    return tf.reduce_sum(residual * residual) / tf.cast(tf.shape(x)[0], tf.float64)


def _client_updates(weights_type, data_type):
    """(the B round's client, the A round's client): (w, data) -> b̃_i, resp. ∇_a l_i(a, b̄),
    each with l_i at (a, b) as received."""

    def unpack(weights, data):
        return (tf.cast(data["x"], tf.float64), tf.cast(data["y"], tf.float64),
                tf.cast(weights["a"], tf.float64), tf.cast(weights["b"], tf.float64))

    @tff.tensorflow.computation(weights_type, data_type)
    def solve_b(weights, data):
        x, y, a, b = unpack(weights, data)
        xa = tf.linalg.matvec(x, a)                                          # X a  (m,)
        b_tilde = tf.linalg.matvec(y, xa, transpose_a=True) / tf.reduce_sum(xa * xa)
        return linear_basics.client_result(b_tilde, _loss(x, y, a, b))   # Yᵀ X a / ‖Xa‖²

    @tff.tensorflow.computation(weights_type, data_type)
    def gradient_a(weights, data):
        x, y, a, b = unpack(weights, data)
        m = tf.cast(tf.shape(x)[0], tf.float64)
        xa = tf.linalg.matvec(x, a)
        grad = (2.0 / m) * (tf.linalg.matvec(x, xa, transpose_a=True) * tf.reduce_sum(b * b)
                            - tf.linalg.matvec(tf.matmul(x, y, transpose_a=True), b))
        return linear_basics.client_result(grad, _loss(x, y, a, b))

    return solve_b, gradient_a


def _on_float64(new_weights):
    """`new_weights(a, b, update)` on float64 vectors, as a `linear_engine.WeightsStep`'s
    function of the float32 weights OrderedDict(a, b) and the update."""

    def new_float32_weights(weights, update):
        a, b = new_weights(tf.cast(weights["a"], tf.float64), tf.cast(weights["b"], tf.float64),
                           tf.cast(update, tf.float64))
        return collections.OrderedDict(a=tf.cast(a, tf.float32), b=tf.cast(b, tf.float32))

    return new_float32_weights


def _round_pieces(name, client_update, weights_type, vector, new_weights):
    factory, _ = rounds.weighted_factory(tff.aggregators.UnweightedMeanFactory())
    return rounds.RoundPieces(
        name, client_update=client_update,
        aggregator=factory.create(vector, tff.TensorType(np.float32)),
        step=linear_engine.WeightsStep(weights_type, vector, _on_float64(new_weights)),
        finalize_metrics=linear_basics.linear_train_metrics)


def build_rolora_alt_min_gd(dim: int, learning_rate: float, seed: int = 0
                            ) -> process_lib.Process:
    """RoLoRA's Algorithm 2 (module docstring) for rank-1 ΔW = a bᵀ ∈ R^{d×d}; η = `learning_rate`
    (the theory needs η ≤ 1/L_max², L_max ≥ ‖b*‖). Returns the stateless `Process` (module
    docstring): round kinds `b_round` and `a_round`, alternating; `config` an `AltMinGDConfig`."""
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"dim={dim} must be >= 1")
    eta = linear_basics.check_rate("learning_rate", learning_rate)
    data_type, weights_type = _data_type(dim), _weights_type(dim)
    vector = tff.TensorType(np.float32, [dim])

    @tff.tensorflow.computation
    def initial_weights():
        a = tf.random.stateless_normal([dim], seed=[int(seed), 0x401A], dtype=tf.float64)
        return collections.OrderedDict(a=tf.cast(a / tf.norm(a), tf.float32),
                                       b=tf.zeros([dim], tf.float32))

    def step_a(a, b, mean_gradient):
        a_plus = a - eta * mean_gradient
        return a_plus / tf.norm(a_plus), b

    solve_b, gradient_a = _client_updates(weights_type, data_type)
    pieces = [_round_pieces(B_ROUND, solve_b, weights_type, vector, lambda a, b, b_bar: (a, b_bar)),
              _round_pieces(A_ROUND, gradient_a, weights_type, vector, step_a)]
    return process_lib.build_process(
        "rolora_linear", pieces,
        process_lib.Federated(initial_weights, data_type, stored=_unit_a),
        schedules.alternating(B_ROUND, A_ROUND),
        process_lib.ProcessSupport(
            check_data=linear_basics.data_checker(dim, "RoLoRA Alt-min-GD", target_dims=2),
            config=AltMinGDConfig(dim=dim, learning_rate=eta, seed=int(seed))),
        shared_cycle_data=True)
