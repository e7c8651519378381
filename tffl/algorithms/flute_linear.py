"""Linear FLUTE (Liu, Shen, Yang, ICML 2024, Algorithm 1) as TFF federated computations.

Model (`shared/specs/flute.md` §1.3): client i predicts ŷ = xᵀ B w_i with B ∈ R^{d×k} shared and
w_i ∈ R^k its personal head; W = [w_1, …, w_M] ∈ R^{k×M}. The ground truths φ_i need not fit a
rank-k model (the *under-parameterized* regime, rank Φ > k). Client i's data loss on its whole
local dataset X_i ∈ R^{N_i×d}, y_i ∈ R^{N_i} is

    L_i(B, w_i) = (1/(2 N_i)) ‖X_i B w_i − y_i‖²

(the 1/(2N) convention of the paper's Appendix A.1 analysis, flute.md §2.3; Algorithm 1 writes
1/N, which is the same iteration with η_l doubled). The regularizer of objective (4) is

    R(B, W) = −γ1 ‖BW‖²_F + γ2 (‖BᵀB‖²_F + ‖WWᵀ‖²_F),

    ∇_B R   = −2γ1 B (WWᵀ) + 4γ2 B (BᵀB),      ∇_{w_i} R = −2γ1 (BᵀB) w_i + 4γ2 (WWᵀ) w_i,

and with γ1 = 2γ2 it equals γ2 ‖BᵀB − WWᵀ‖²_F (since ‖BW‖²_F = tr(BᵀB·WWᵀ)).

One round (`next`, Algorithm 1, eqs. 5–6; one simultaneous gradient step, everything evaluated at
the old point (B, W)):

1. the server broadcasts B;
2. client i computes, on its full local batch, ∇_B L_i = (1/N_i) X_iᵀ(X_i B w_i − y_i) w_iᵀ (d×k)
   and uploads it together with its head's outer product w_i w_iᵀ (k×k);
3. the server *sums* both (`tff.federated_sum`): Σ_i ∇_B L_i (a sum, not a mean — eq. 5) and
   G = Σ_i w_i w_iᵀ = WWᵀ, and sets

       B ← B − η_l Σ_i ∇_B L_i − η_r ∇_B R(B, W)       (∇_B R needs only B and G);

4. the server broadcasts G; client i sets

       w_i ← w_i − η_l ∇_{w_i} L_i(B, w_i) − η_r ∇_{w_i} R(B, W)   (needs only B, G and w_i).

So a round is one gradient step on Σ_i L_i(B, w_i) + (η_r/η_l) R(B, W) (η_l = η_r: on Σ_i L_i + R).
There is no QR, SVD or projection anywhere (flute.md §8.1).

Where the heads live. Algorithm 1 keeps W at the server: clients upload ∇_{w_i} L_i and the server
applies both steps to every w_i. Nothing in the server's W step needs more of W than G = WWᵀ
(∇_{w_i}R above), and G is a sum of per-client terms, so this module keeps w_i on its client as
*personal state* (`tffl.engine.personal_state` template) and gives the server only the aggregate G (an
extra k×k up and down per round). The iterates are exactly Algorithm 1's; what the server learns
is the sum WWᵀ instead of every head (with a secure-sum aggregator, not even individual w_i w_iᵀ).

Participation. The paper's setting is full participation: all M clients every round; then the
iteration is exactly Algorithm 1. If a round sees only a subset I of the clients, the sums in
steps 3–4 run over I: B takes the data step of Σ_{i∈I} L_i (its size scales with |I|) and the
regularizer of the participating heads, R(B, W_I) with G = W_I W_Iᵀ — the analogue of general
FLUTE's server step over the sampled heads (Algorithm 2) — and non-participants keep their heads
unchanged (the personal store leaves them alone). That is a choice of this implementation, not
something the paper analyses.

Initialization (Algorithm 1, Remark 4.1): small and data independent, every entry of B⁰ and of
each w_i⁰ i.i.d. N(0, α²), α = `init_scale` (default 1/(10d), the paper's experiments). w_i⁰ is
seeded by (`seed`, client id), so a client's start does not depend on who else exists.

Client data: one value per client, `OrderedDict(x=float32[N_i, d], y=float32[N_i])` (the whole
local dataset: the gradients are full batch). Personal state: `OrderedDict(head=float32[k])`.
Inside the computations the algebra runs in float64; results are cast back to float32. The round
is one round kind of the engine's composer (`tffl.engine.composition`) with two exchanges: the
distributor sends B, the client work uploads (∇_B L_i, w_i w_iᵀ), the aggregator sums them
(`tff.aggregators.SumFactory`), the finalizer takes the server step on B, and the kind's second
exchange (`tffl.engine.rounds.SecondExchange`) sends G = WWᵀ and steps each head at the old B,
which the clients still hold from the first exchange. This module writes only FLUTE's client and
server steps (steps 2–4 above) as `tff.tensorflow.computation`s.

Metrics of a round (at the server, at the old point, in TFF's structure): `client_work/train`
holds `loss` = (1/|I|) Σ_i L_i(B, w_i) and `num_clients` = |I|; `finalizer/regularizer` = R(B,
W_I), formed by the server step from B and G alone (‖BW‖² = tr(BᵀB G)). The paper's error
(1/M) Σ_i ‖B w_i − φ_i‖ needs the ground truth and is the caller's (`predictors` gives the B w_i).

The process. `build_flute_linear` returns a personalized `tffl.engine.process.Process`
(`personal`: `head`, float32[k]; `next: (S@SERVER, D@CLIENTS, P@CLIENTS) -> PersonalizedOutput`)
whose model weights are B (`get_model_weights`; `set_model_weights` stores B as is). Its `config`
is a `FluteLinearConfig` (the hyperparameters). The module's functions: `initial_personal(config,
client_id)` (what `process.initialize_personal` gives), `heads(personal_states)`,
`predictors(state, personal_states)`; B itself is read and set by
`tffl.engine.linear_engine.get_representation(state)` and `set_representation(process, state,
b)` (shape-checked).

Example:

>>> process = build_flute_linear(dim=10, rank=2, learning_rate=0.03)
>>> ids = [f"client_{i}" for i in range(len(data))]
>>> personal = [process.initialize_personal(cid) for cid in ids]
>>> with runtime.local_runtime():
...     state = process.initialize()
...     output = process.next_round(state, data, personal)     # PersonalizedOutput
...     state, personal = output.state, output.personal_states
>>> thetas = predictors(state, personal)                 # (M, d): row i is B w_i
>>> thetas.shape                                         # `data`: 4 clients, d = 10
(4, 10)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import zlib
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import linear_basics
from tffl.engine import linear_engine
from tffl.engine import process as process_lib
from tffl.engine import rounds


def regularizer_gradients(b64: tf.Tensor, gram64: tf.Tensor, gamma1: float, gamma2: float
                          ) -> tf.Tensor:
    """∇_B R = −2γ1 B G + 4γ2 B BᵀB (d×k) for G = WWᵀ (k×k)."""
    return -2.0 * gamma1 * (b64 @ gram64) + 4.0 * gamma2 * (b64 @ (tf.transpose(b64) @ b64))


@dataclasses.dataclass(frozen=True)
class FluteLinearConfig:
    """Linear FLUTE's configuration (a process's `config`).

    Attributes:
      dim, rank: d, k.
      learning_rate, regularizer_learning_rate: η_l, η_r.
      gamma1, gamma2: γ1, γ2.
      init_scale: α, the standard deviation of the initial entries.
      seed: seed of B⁰ and of every w_i⁰.
    """

    dim: int
    rank: int
    learning_rate: float
    regularizer_learning_rate: float
    gamma1: float
    gamma2: float
    init_scale: float
    seed: int


def personal_shapes(dim: int, rank: int) -> collections.OrderedDict:
    """One client's personal state: its head w_i (k,)."""
    del dim
    return collections.OrderedDict(head=(rank,))


def initial_personal(config: FluteLinearConfig, client_id: Any) -> collections.OrderedDict:
    """Client `client_id`'s initial head w⁰ ~ N(0, α² I_k), seeded by (seed, client id)."""
    key = zlib.crc32(str(client_id).encode("utf-8"))
    rng = np.random.default_rng([int(config.seed), key])
    head = config.init_scale * rng.standard_normal(config.rank)
    return collections.OrderedDict(head=head.astype(np.float32))


def heads(personal_states) -> np.ndarray:
    """W (k×M) from the clients' personal states (column i = w_i)."""
    return linear_basics.stack_personal(personal_states, "head").T


def predictors(state, personal_states) -> np.ndarray:
    """The personalized regressors B w_i (M×d, float64; row i is client i's)."""
    return (linear_engine.get_representation(state).astype(np.float64) @ heads(personal_states)).T


def _checked(dim, rank, learning_rate, regularizer_learning_rate, gamma1, gamma2, init_scale
             ) -> tuple[int, int, float, float, float, float, float]:
    """(d, k, η_l, η_r, γ1, γ2, α) checked, with the defaults η_r = η_l and α = 1/(10d) filled in
    (`build_flute_linear`'s Raises)."""
    check_rate = linear_basics.check_rate
    dim, rank = linear_basics.check_dims(dim, rank)
    eta_l = check_rate("learning_rate", learning_rate)
    eta_r = check_rate("regularizer_learning_rate",
                       eta_l if regularizer_learning_rate is None else regularizer_learning_rate,
                       allow_zero=True)
    g1 = check_rate("gamma1", gamma1, allow_zero=True)
    g2 = check_rate("gamma2", gamma2, allow_zero=True)
    alpha = check_rate("init_scale", 1.0 / (10 * dim) if init_scale is None else init_scale)
    return dim, rank, eta_l, eta_r, g1, g2, alpha


def _data_terms(b64, data, w64):
    """(X, residual X B w − y, m) in float64 for the client's full batch."""
    x64, y64, m = linear_basics.batch64(data)
    residual = tf.linalg.matvec(x64 @ b64, w64) - y64                         # (N,)
    return x64, residual, m


def _client_steps(server: linear_engine.LinearServer, personal_type: tff.Type, eta_l: float,
                  eta_r: float, g1: float, g2: float) -> tuple[tff.Computation, tff.Computation]:
    """FLUTE's two client computations: the statistic of step 2 and the head step of step 4."""
    b_type, data_type = server.representation_type, server.data_type
    gram_type = tff.TensorType(np.float32, [server.rank, server.rank])

    @tff.tensorflow.computation(b_type, data_type, personal_type)
    def client_statistics(b, data, personal):
        """Uploads ∇_B L_i (d×k) and w_i w_iᵀ (k×k); L_i; all at the old point."""
        b64, w64 = tf.cast(b, tf.float64), tf.cast(personal["head"], tf.float64)
        x64, residual, m = _data_terms(b64, data, w64)
        xtr = tf.linalg.matvec(x64, residual, transpose_a=True) / m           # (d,)
        statistics = collections.OrderedDict(
            representation_gradient=xtr[:, tf.newaxis] * w64[tf.newaxis, :],
            head_gram=w64[:, tf.newaxis] * w64[tf.newaxis, :])
        return linear_basics.client_result(statistics, tf.reduce_sum(residual**2) / (2.0 * m),
                                           personal)

    @tff.tensorflow.computation(b_type, gram_type, data_type, personal_type)
    def client_head_update(b, gram, data, personal):
        """w_i − η_l ∇_{w_i} L_i − η_r ∇_{w_i} R, everything at the old point (kept, not sent)."""
        b64, w64 = tf.cast(b, tf.float64), tf.cast(personal["head"], tf.float64)
        g64 = tf.cast(gram, tf.float64)
        x64, residual, m = _data_terms(b64, data, w64)
        grad_data = tf.linalg.matvec(x64 @ b64, residual, transpose_a=True) / m          # (k,)
        grad_reg = (-2.0 * g1 * tf.linalg.matvec(tf.transpose(b64) @ b64, w64)
                    + 4.0 * g2 * tf.linalg.matvec(g64, w64))
        head = w64 - eta_l * grad_data - eta_r * grad_reg
        return collections.OrderedDict(head=tf.cast(head, tf.float32))

    return client_statistics, client_head_update


def _round_pieces(server: linear_engine.LinearServer, client_statistics, client_head_update,
                  eta_l: float, eta_r: float, g1: float, g2: float) -> rounds.RoundPieces:
    """FLUTE's round kind (steps 1–4): B broadcast, the statistics summed, the server step on B
    with the `regularizer` measured, and the second exchange's G = WWᵀ and head step."""
    b_type = server.representation_type
    sums_type = client_statistics.type_signature.result[0].update

    def new_representation(b, sums):
        """B − η_l Σ_i ∇_B L_i − η_r ∇_B R(B, W); round_num + 1 (the finalizer's)."""
        b64 = tf.cast(b, tf.float64)
        new = (b64 - eta_l * tf.cast(sums["representation_gradient"], tf.float64)
               - eta_r * regularizer_gradients(b64, tf.cast(sums["head_gram"], tf.float64),
                                               g1, g2))
        return tf.cast(new, tf.float32)

    @tff.tensorflow.computation(b_type, sums_type, np.int32)
    def regularizer_value(b, sums, round_num):
        """R = −γ1 tr(BᵀB G) + γ2 (‖BᵀB‖² + ‖G‖²) with G = WWᵀ."""
        del round_num
        b64, g64 = tf.cast(b, tf.float64), tf.cast(sums["head_gram"], tf.float64)
        btb = tf.transpose(b64) @ b64
        value = (-g1 * tf.linalg.trace(btb @ g64)
                 + g2 * (tf.reduce_sum(btb**2) + tf.reduce_sum(g64**2)))
        return collections.OrderedDict(regularizer=tf.cast(value, tf.float32))

    @tff.tensorflow.computation(sums_type)
    def gram(sums):
        """G = WWᵀ, the second exchange's broadcast."""
        return sums["head_gram"]

    return rounds.RoundPieces(   # summed (unweighted): no weight goes up
        linear_engine.ROUND, client_statistics,
        aggregator=tff.aggregators.SumFactory().create(sums_type),
        step=linear_engine.WeightsStep(b_type, sums_type, new_representation),
        measure=regularizer_value,
        second_exchange=rounds.SecondExchange(gram, client_head_update),
        finalize_metrics=linear_basics.linear_train_metrics)


def build_flute_linear(
    dim: int,
    rank: int,
    learning_rate: float,
    regularizer_learning_rate: float | None = None,
    gamma1: float = 0.25,
    gamma2: float = 0.125,
    init_scale: float | None = None,
    seed: int = 0,
) -> process_lib.Process:
    """Linear FLUTE (Algorithm 1): d = `dim`, k = `rank`, η_l, η_r, γ1, γ2, α = `init_scale`.

    A round is one round kind with two exchanges and personal state (the heads): the first
    exchange sums (∇_B L_i, w_i w_iᵀ), the server steps B and sends G = WWᵀ, the second
    exchange steps each head (module docstring, steps 1–4).

    Args:
      dim: d >= 1.
      rank: k, 1 <= k <= d.
      learning_rate: η_l > 0, the step of the data gradients (the paper's synthetic runs: 0.03).
      regularizer_learning_rate: η_r >= 0, the step of the regularizer gradients (default η_l, as
        in the theory; 0 turns the regularizer off, leaving plain joint gradient descent).
      gamma1: γ1 >= 0, the weight of −‖BW‖²_F (theory: 1/4).
      gamma2: γ2 >= 0, the weight of ‖BᵀB‖²_F + ‖WWᵀ‖²_F (theory: 1/8). The paper does not try
        γ1 > 2γ2 ("‖BW‖_F usually diverges"); with γ1 <= 2γ2, R >= 0.
      init_scale: α > 0, the standard deviation of the entries of B⁰ and w_i⁰ (default 1/(10d)).
      seed: seed of B⁰ and of the heads' initialization.

    Returns:
      The personalized `Process` (module docstring); `config` a `FluteLinearConfig`.

    Raises:
      ValueError: d < 1, k outside [1, d], η_l <= 0, η_r < 0, γ1 < 0, γ2 < 0, α <= 0, or any of
        them not finite; the message names the value.
    """
    dim, rank, eta_l, eta_r, g1, g2, alpha = _checked(
        dim, rank, learning_rate, regularizer_learning_rate, gamma1, gamma2, init_scale)
    server = linear_engine.build_server(
        dim, rank, lambda: alpha * linear_basics.gaussian(dim, rank, seed, stream=1),
        orthonormal=False)
    config = FluteLinearConfig(dim=dim, rank=rank, learning_rate=eta_l,
                               regularizer_learning_rate=eta_r, gamma1=g1, gamma2=g2,
                               init_scale=alpha, seed=int(seed))
    personal = linear_basics.personal_spec(personal_shapes(dim, rank),
                                           functools.partial(initial_personal, config))
    steps = _client_steps(server, personal.type, eta_l, eta_r, g1, g2)
    return process_lib.build_process(
        "flute_linear", [_round_pieces(server, *steps, eta_l, eta_r, g1, g2)],
        server.federated(personal),
        support=process_lib.ProcessSupport(
            check_data=linear_basics.data_checker(dim, "flute_linear"), config=config))
