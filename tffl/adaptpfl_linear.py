"""Linear AdaptPFL (the February 2025 draft's Algorithm 1, repaired) as TFF federated computations.

Model (`shared/specs/adaptpfl.md` §1.2): client i predicts ŷ = xᵀ θ_i with

    θ_i = (1 − α) B w_i + α s_i,

B ∈ R^{d×k} the shared representation (the only thing communicated), w_i ∈ R^k the personal head
and s_i ∈ R^d the personal *shortcut*, a direct path around the representation; α ∈ [0, 1] is a
fixed mixing weight. Client i's objective on its batch X_i ∈ R^{m_i×d}, y_i ∈ R^{m_i} is

    f_i(w, B, s) = (1/(2 m_i)) ‖X_i((1 − α) B w + α s) − y_i‖²  (+ (β/2)‖s‖² in the s phase),

with residual r = X_i θ − y_i and the *true* gradients (adaptpfl.md §1.2)

    ∇_w f_i = ((1 − α)/m_i) Bᵀ X_iᵀ r,   ∇_s f_i = (α/m_i) X_iᵀ r (+ β s),
    ∇_B f_i = ((1 − α)/m_i) X_iᵀ r wᵀ.

One round (`next`; variant A of adaptpfl.md §1.4, "Algorithm 1 with the obvious fixes"):

1. the server broadcasts B (= B^{t−1});
2. client i, starting from its stored (w_i, s_i):
   a. head phase, τ_w steps:      w ← w − η_w ∇_w f_i(w, B, s_old)  (B and the stored s fixed);
   b. shortcut phase, τ_s steps:  s ← s − η_s ∇_s f_i(w_new, B, s)  (the head just updated);
   c. representation phase, τ_b steps from B_i = B:
                                  B_i ← B_i − η_b ∇_B f_i(w_new, B_i, s_new);
   and keeps (w_new, s_new) as its personal state, uploading only B_i;
3. the server takes the unweighted mean B ← (1/|I|) Σ_{i∈I} B_i (Algorithm 1, line 26).

Clients that do not take part keep (w_i, s_i) (the personal store leaves them alone). Nothing is
orthonormalized: the heads are warm-started gradient iterates expressed in B's basis, and a QR of
B would silently change what every stored head means.

Choices for the draft's inconsistencies (adaptpfl.md §4; numbers are that table's rows):

* #2 the loop runs t = 1..T from the initial personal state (w_i⁰, s_i⁰); #3 the broadcast is
  B^{t−1} (the draft's φ^t is FedRep's symbol); #4 τ_h is τ_w; #6 one client index, and
  non-participants keep their w_i, s_i.
* #5 (line 14 uses an undefined w_i^{t−1}): the shortcut phase uses the head *just updated* in this
  round (Gauss–Seidel, as line 19 does for B); the head phase uses the stored shortcut
  (line 9's s_i^{t−1,τ_s}).
* #7 α, the step sizes and an optional ridge β on s are explicit hyperparameters; #12 the
  gradients carry the (1 − α) and α factors (the draft's eq. 7 drops (1 − α)).
* #8 / §1.6: this is Algorithm 1 (head → shortcut → representation, τ gradient steps each, no
  projection, no damping, no QR). The analysed iteration (2)–(8) — exact ridge / least-squares
  solves, projection of s onto span(B)^⊥, damping λ_S, λ_W, one B step then QR — is *not*
  implemented here.
* Initialization (undeclared in the draft): B⁰ a seeded random orthonormal d×k (or any B via
  `set_representation`, e.g. FedRep's method-of-moments B⁰ from `tffl.fedrep_linear`);
  w_i⁰ = 0 and s_i⁰ = 0 (§1.4; s⁰ = 0 is LoRA's zero-initialized branch).

α = 0 is FedRep with gradient heads, exactly: the shortcut gets zero gradient and never moves,
θ_i = B w_i, and the round is "τ_w head GD steps with B fixed, then τ_b local GD steps on B with
the new head, then the plain mean of the B_i" — FedRep's Algorithm 1 with GRD = one full-batch
gradient step, warm-started heads and no QR. (The shortcut terms vanish exactly in floating
point — (1 − 0)·Bw + 0·s = Bw — so these are FedRep's iterates, not an approximation of them.)
α = 1 is local linear regression on s alone: B and w receive zero gradient.

Client data: one value per client, `OrderedDict(x=float32[m_i, d], y=float32[m_i])` (a full
batch; fresh samples per round, as the draft's theory wants, are the caller's: pass new data to
each `next`). Personal state: `OrderedDict(head=float32[k], shortcut=float32[d])`. The algebra
runs in float64 inside the client computation; results are cast to float32.

Metrics of a round (at the server): `loss` = mean over clients of f_i (without the ridge) at the
start of the round (broadcast B, stored w_i, s_i); `num_clients`.

Example:

>>> process = build_adaptpfl_linear(dim=20, rank=2, alpha=0.3, learning_rate=0.1,
...                                 head_steps=10, shortcut_steps=10, representation_steps=1)
>>> personal = [process.initialize_personal(cid) for cid in client_ids]
>>> with runtime.local_runtime():
...     state = process.initialize()
...     output = process.next(state, data, personal)
...     state, personal = output.state, output.personal_states
>>> thetas = process.predictors(state, personal)     # (N, d): row i is θ_i
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import personal_state


def _orthonormalize(b: tf.Tensor) -> tf.Tensor:
    """Q of the thin QR b = QR (d×k), column signs fixed so that diag(R) >= 0."""
    q, r = tf.linalg.qr(b)
    diag = tf.linalg.diag_part(r)
    signs = tf.where(diag < 0, -tf.ones_like(diag), tf.ones_like(diag))
    return q * signs[tf.newaxis, :]


def _gradient_descent(steps: int, value: tf.Tensor, step_fn) -> tf.Tensor:
    """`steps` iterations value ← step_fn(value) (a `tf.while_loop`; 0 steps returns value)."""
    if steps == 0:
        return value
    _, result = tf.while_loop(
        lambda i, v: i < steps, lambda i, v: (i + 1, step_fn(v)),
        (tf.constant(0), value))
    return result


def _nonnegative_int(name: str, value: int) -> int:
    if int(value) != value or value < 0:
        raise ValueError(f"{name}={value} must be an integer >= 0")
    return int(value)


def _rate(name: str, value: float, allow_zero: bool = False) -> float:
    value = float(value)
    if not (np.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name}={value} must be a finite number {'>=' if allow_zero else '>'} 0")
    return value


@dataclasses.dataclass(frozen=True)
class AdaptPFLLinearProcess:
    """Linear AdaptPFL: server state `OrderedDict(representation=float32[d, k], round_num=int32)`,
    personal state `OrderedDict(head=float32[k], shortcut=float32[d])` per client.

    Attributes (TFF computations; the methods below add shape checks):
      initialize_computation: () -> state@SERVER, B⁰ = orthonormalized N(0, 1) d×k (seeded).
      next_computation: (state@SERVER, data@CLIENTS, personal@CLIENTS) ->
        `PersonalizedOutput(state@SERVER, personal@CLIENTS, metrics@SERVER)`.
      set_representation_computation: (state, float32[d, k]) -> state with that B (as is).
      dim, rank, alpha: d, k, α.
      learning_rate, head_learning_rate, shortcut_learning_rate: η_b, η_w, η_s.
      head_steps, shortcut_steps, representation_steps: τ_w, τ_s, τ_b.
      shortcut_ridge: β.
    """

    initialize_computation: tff.Computation
    next_computation: tff.Computation
    set_representation_computation: tff.Computation
    dim: int
    rank: int
    alpha: float
    learning_rate: float
    head_learning_rate: float
    shortcut_learning_rate: float
    head_steps: int
    shortcut_steps: int
    representation_steps: int
    shortcut_ridge: float

    def _check_data(self, client_data, personal_states) -> None:
        if len(client_data) != len(personal_states):
            raise ValueError(f"{len(client_data)} clients' data but {len(personal_states)} "
                             "personal states; pass one personal state per client, in order")
        for i, item in enumerate(client_data):
            x, y = np.shape(item["x"]), np.shape(item["y"])
            if len(x) != 2 or x[1] != self.dim or len(y) != 1 or y[0] != x[0] or x[0] < 1:
                raise ValueError(f"client {i}: expected x of shape (m, {self.dim}) and y of shape "
                                 f"(m,) with m >= 1, got {x} and {y}")
        for i, p in enumerate(personal_states):
            head, shortcut = np.shape(p["head"]), np.shape(p["shortcut"])
            if head != (self.rank,) or shortcut != (self.dim,):
                raise ValueError(f"client {i}: personal head and shortcut must have shapes "
                                 f"({self.rank},) and ({self.dim},), got {head} and {shortcut}")

    def initialize(self):
        """State with a seeded random orthonormal B (d×k) and round_num 0."""
        return self.initialize_computation()

    def initialize_personal(self, client_id: Any) -> collections.OrderedDict:
        """Every client starts at w⁰ = 0, s⁰ = 0 (`client_id` is not needed)."""
        del client_id
        return collections.OrderedDict(head=np.zeros(self.rank, np.float32),
                                       shortcut=np.zeros(self.dim, np.float32))

    def next(self, state, client_data, personal_states) -> personal_state.PersonalizedOutput:
        """One AdaptPFL round on `client_data` (a list of `{x: (m_i, d), y: (m_i,)}`) with the
        clients' `personal_states` (same order)."""
        personal_states = list(personal_states)
        self._check_data(client_data, personal_states)
        output = self.next_computation(state, client_data, personal_states)
        return personal_state.PersonalizedOutput(*output)

    @staticmethod
    def get_representation(state) -> np.ndarray:
        """B (d×k, float32) of a state."""
        return np.asarray(state["representation"])

    def set_representation(self, state, representation):
        """A copy of `state` with B = `representation` (d×k), not orthonormalized."""
        shape = np.shape(representation)
        if shape != (self.dim, self.rank):
            raise ValueError(f"representation must have shape ({self.dim}, {self.rank}), "
                             f"got {shape}")
        return self.set_representation_computation(state, np.asarray(representation, np.float32))

    def predictors(self, state, personal_states) -> np.ndarray:
        """θ_i = (1 − α) B w_i + α s_i for every client (N×d, float64; row i is client i's)."""
        b = self.get_representation(state).astype(np.float64)
        heads = np.stack([np.asarray(p["head"], np.float64) for p in personal_states])
        shortcuts = np.stack([np.asarray(p["shortcut"], np.float64) for p in personal_states])
        return (1.0 - self.alpha) * heads @ b.T + self.alpha * shortcuts


def build_adaptpfl_linear(
    dim: int,
    rank: int,
    alpha: float,
    learning_rate: float,
    head_steps: int = 10,
    shortcut_steps: int = 10,
    representation_steps: int = 1,
    head_learning_rate: float | None = None,
    shortcut_learning_rate: float | None = None,
    shortcut_ridge: float = 0.0,
    seed: int = 0,
) -> AdaptPFLLinearProcess:
    """Linear AdaptPFL (Algorithm 1, variant A): θ_i = (1 − α) B w_i + α s_i.

    Args:
      dim: d >= 1.
      rank: k, 1 <= k <= d.
      alpha: α in [0, 1] (0: FedRep with gradient heads; 1: local regression on s).
      learning_rate: η_b > 0, the step of the representation phase (and the default of the
        other two).
      head_steps: τ_w >= 0 gradient steps on the head per round.
      shortcut_steps: τ_s >= 0 gradient steps on the shortcut per round.
      representation_steps: τ_b >= 0 local gradient steps on B per round.
      head_learning_rate: η_w > 0 (default η_b; the draft uses one η).
      shortcut_learning_rate: η_s > 0 (default η_b).
      shortcut_ridge: β >= 0, weight decay (β/2)‖s‖² in the shortcut phase (the draft's β of
        eq. 2, per client; 0 by default as in Algorithm 1).
      seed: seed of `initialize`'s random orthonormal B.

    Raises:
      ValueError: d < 1, k outside [1, d], α outside [0, 1], a step size <= 0, a step count that
        is negative or not an integer, β < 0, or a non-finite value; the message names the value.
    """
    dim, rank = int(dim), int(rank)
    if dim < 1:
        raise ValueError(f"dim={dim} must be >= 1")
    if not 1 <= rank <= dim:
        raise ValueError(f"rank={rank} must satisfy 1 <= rank <= dim={dim}")
    alpha = float(alpha)
    if not (np.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha={alpha} must be in [0, 1]")
    eta_b = _rate("learning_rate", learning_rate)
    eta_w = _rate("head_learning_rate", eta_b if head_learning_rate is None
                  else head_learning_rate)
    eta_s = _rate("shortcut_learning_rate", eta_b if shortcut_learning_rate is None
                  else shortcut_learning_rate)
    tau_w = _nonnegative_int("head_steps", head_steps)
    tau_s = _nonnegative_int("shortcut_steps", shortcut_steps)
    tau_b = _nonnegative_int("representation_steps", representation_steps)
    beta = _rate("shortcut_ridge", shortcut_ridge, allow_zero=True)

    b_type = tff.TensorType(np.float32, [dim, rank])
    data_type = tff.StructWithPythonType(
        [("x", tff.TensorType(np.float32, [None, dim])), ("y", tff.TensorType(np.float32, [None]))],
        collections.OrderedDict,
    )
    personal_type = tff.StructWithPythonType(
        [("head", tff.TensorType(np.float32, [rank])),
         ("shortcut", tff.TensorType(np.float32, [dim]))],
        collections.OrderedDict,
    )

    @tff.tensorflow.computation(b_type, data_type, personal_type)
    def client_update(b, data, personal):
        """(B, data, (w_i, s_i)) -> {representation: B_i, personal: (w_i', s_i'), loss}."""
        b64 = tf.cast(b, tf.float64)
        x64, y64 = tf.cast(data["x"], tf.float64), tf.cast(data["y"], tf.float64)
        m = tf.cast(tf.shape(x64)[0], tf.float64)
        w0 = tf.cast(personal["head"], tf.float64)
        s0 = tf.cast(personal["shortcut"], tf.float64)

        def residual(bb, w, s):
            theta = (1.0 - alpha) * tf.linalg.matvec(bb, w) + alpha * s           # (d,)
            return tf.linalg.matvec(x64, theta) - y64                              # (m,)

        def xtr(bb, w, s):
            return tf.linalg.matvec(x64, residual(bb, w, s), transpose_a=True) / m  # (d,)

        loss = tf.reduce_sum(residual(b64, w0, s0) ** 2) / (2.0 * m)
        w = _gradient_descent(tau_w, w0, lambda w: w - eta_w * (1.0 - alpha)
                              * tf.linalg.matvec(b64, xtr(b64, w, s0), transpose_a=True))
        s = _gradient_descent(tau_s, s0, lambda s: s - eta_s * (alpha * xtr(b64, w, s)
                                                                 + beta * s))
        b_i = _gradient_descent(tau_b, b64, lambda bb: bb - eta_b * (1.0 - alpha)
                                * xtr(bb, w, s)[:, tf.newaxis] * w[tf.newaxis, :])
        return collections.OrderedDict(
            representation=tf.cast(b_i, tf.float32),
            personal=collections.OrderedDict(head=tf.cast(w, tf.float32),
                                             shortcut=tf.cast(s, tf.float32)),
            loss=tf.cast(loss, tf.float32),
        )

    @tff.tensorflow.computation
    def random_representation():
        g = tf.random.stateless_normal([dim, rank], seed=[int(seed), 0], dtype=tf.float64)
        return tf.cast(_orthonormalize(g), tf.float32)

    @tff.tensorflow.computation(b_type)
    def fresh_state(b):
        return collections.OrderedDict(representation=b, round_num=tf.constant(0, tf.int32))

    @tff.federated_computation
    def initialize():
        return tff.federated_map(fresh_state, tff.federated_eval(random_representation,
                                                                 tff.SERVER))

    state_type = initialize.type_signature.result

    @tff.tensorflow.computation(state_type.member)
    def increment(state):
        return state["round_num"] + 1

    @tff.tensorflow.computation(state_type.member, b_type)
    def with_representation(state, b):
        return collections.OrderedDict(representation=b, round_num=state["round_num"])

    @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS),
                               tff.FederatedType(personal_type, tff.CLIENTS))
    def next_fn(state, data, personal):
        b = tff.federated_broadcast(state.representation)
        out = tff.federated_map(client_update, (b, data, personal))
        new_state = tff.federated_zip(collections.OrderedDict(
            representation=tff.federated_mean(out.representation),
            round_num=tff.federated_map(increment, state),
        ))
        metrics = tff.federated_zip(collections.OrderedDict(
            loss=tff.federated_mean(out.loss),
            num_clients=tff.federated_sum(tff.federated_value(np.int32(1), tff.CLIENTS)),
        ))
        return new_state, out.personal, metrics

    return AdaptPFLLinearProcess(
        initialize_computation=initialize,
        next_computation=next_fn,
        set_representation_computation=with_representation,
        dim=dim,
        rank=rank,
        alpha=alpha,
        learning_rate=eta_b,
        head_learning_rate=eta_w,
        shortcut_learning_rate=eta_s,
        head_steps=tau_w,
        shortcut_steps=tau_s,
        representation_steps=tau_b,
        shortcut_ridge=beta,
    )
