"""The shared machinery of the linear algorithms (`fedrep_linear`, `flute_linear`,
`adaptpfl_linear`, `rolora_linear`): the server and its state, argument checks, the averaging
round and the `tffl.engine.process.Process` each builder returns.

A linear model. Client i holds a batch X_i ∈ R^{m_i×d}, y_i ∈ R^{m_i} and predicts ŷ = xᵀ θ_i,
where θ_i ∈ R^d is built from the shared representation B ∈ R^{d×k} (k ≤ d) and the client's
personal variables p_i (FedRep, FLUTE: θ_i = B w_i, p_i = w_i ∈ R^k; AdaptPFL:
θ_i = (1 − α) B w_i + α s_i, p_i = (w_i, s_i)). The losses are least squares,
(1/(2 m_i)) ‖X_i θ_i − y_i‖², so every step is a few matrix products: no Keras model is needed.

A linear round t over the participating clients I (|I| = n):

1. the server broadcasts B (float32[d, k]);
2. client i runs its algorithm's client computation on (B, X_i, y_i[, p_i]) and returns what the
   server aggregates (e.g. B_i, or ∇_B L_i), its loss ℓ_i at the start of the round and, if the
   algorithm has one, its new personal state p_i';
3. the server forms the new B from the aggregates; B' and round_num t + 1;
4. metrics, in TFF's learning-process structure (`linear_train_metrics` for the rounds the
   composer builds, `round_metrics` for the two-exchange one): `client_work/train` holds
   `loss` = (1/n) Σ_{i∈I} ℓ_i and `num_clients` = n; `finalizer` any algorithm-specific server
   values.

The *averaging round* (`build_averaging_round`, FedRep and AdaptPFL) is built as every Keras
round is: TFF's four pieces — distributor (broadcast B), client work (the algorithm's client
computation, uploading `ClientResult(B_i, 1)` and its metric sums), aggregator (a
`tff.aggregators` factory, by default the unweighted mean (1/n) Σ_{i∈I} B_i whatever the m_i)
and finalizer (`representation_step`: P, the identity or `orthonormalize`, B̄ = QR, P(B̄) = Q with
diag(R) ≥ 0) — composed by `tffl.engine.composition.compose_kinds`, so its state, metrics and
`LearningProcess` are the Keras algorithms'. RoLoRA's Alt-min-GD is two such round kinds on
(a, b) (`tffl.algorithms.rolora_linear`, with this module's `linear_train_metrics`). Linear
FLUTE's round, whose second exchange needs the first one's aggregate and the old B, is
`build_two_exchange_round`, in `tffl.engine.linear_rounds` with `round_metrics` (re-exported
here). An algorithm module writes only `tff.tensorflow.computation`s and calls these builders.

TFF placement and types:

    server state   LearningAlgorithmState(global_model_weights=float32[d, k],
                       distributor=(), client_work=(), aggregator={round: …},
                       finalizer={round_num=int32, steps={round: {}}})          @SERVER
    client data    OrderedDict(x=float32[m_i, d], y=float32[m_i])                @CLIENTS
    personal state OrderedDict(<name>=float32[shape], …)                         @CLIENTS

(RoLoRA's Alt-min-GD: the same state with global_model_weights = OrderedDict(a, b), and its
aggregator and server-step states keyed by its round kinds, b_round and a_round.)

Client data are tensors, one value per client (not `tf.data` sequences: exact solves and full-
batch gradients need the whole batch at once); the type has shape [None, d], so m_i may differ.
Inside the `tff.tensorflow.computation`s the algebra runs in float64 (`batch64`); results are
cast back to float32 at the boundary.

The process (`LinearServer.build_process`) is a `tffl.engine.process.Process` with one round
kind, `"round"`: stateless ones are TFF `LearningProcess`es whose model weights are B
(`get_model_weights: S -> float32[d, k]`, `set_model_weights: <S, B> -> S`); personalized ones
declare the personal state (`personal_spec`; `tffl.engine.personal_state`'s protocol: clients
that sit out keep theirs). `next_round` checks the client data (`data_checker`) and the personal
states first. Python-side helpers: `get_representation`, `set_representation` (shape-checked),
`stack_personal`.

Example (an averaging round: fixed unit heads w = 1_k, one gradient step on B, QR):

>>> server = build_server(10, 2, lambda: orthonormalize(gaussian(10, 2, seed=0)),
...                       orthonormal=True)
>>> @tff.tensorflow.computation(server.representation_type, server.data_type)
... def client_update(b, data):
...     x64, y64, m = batch64(data)
...     r = tf.reduce_sum(x64 @ tf.cast(b, tf.float64), axis=1) - y64    # X B 1 − y  (m,)
...     step = tf.linalg.matvec(x64, r, transpose_a=True)[:, None] / m    # (d, 1), every column
...     return collections.OrderedDict(
...         representation=tf.cast(tf.cast(b, tf.float64) - 0.1 * step, tf.float32),
...         loss=tf.cast(tf.reduce_sum(r**2) / (2.0 * m), tf.float32))
>>> next_fn = build_averaging_round(server, client_update)     # P: QR (orthonormal)
>>> process = server.build_process("unit_heads", next_fn, config=None)
>>> with runtime.local_runtime():
...     output = process.next_round(process.initialize(), data)   # `data`: 4 clients, d = 10
>>> b = get_representation(output.state)
>>> b.shape, bool(np.allclose(b.T @ b, np.eye(2), atol=1e-5))
((10, 2), True)
>>> int(output.metrics["client_work"]["train"]["num_clients"])
4
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import runtime as _runtime  # noqa: F401  (its exit hook stops every TFF worker)
from tffl.engine import communication
from tffl.engine import composition
from tffl.engine import linear_basics
from tffl.engine import process as process_lib
from tffl.engine import rounds as engine
from tffl.engine.linear_basics import (  # noqa: F401  (re-exported)
    batch64,
    check_dims,
    check_rate,
    client_result,
    data_checker,
    data_type,
    gaussian,
    linear_train_metrics,
    orthonormalize,
    personal_spec,
    stack_personal,
)
from tffl.engine.linear_rounds import (  # noqa: F401  (re-exported)
    build_two_exchange_round,
    client_traffic,
    count_clients,
    round_metrics,
    two_exchange_traffic,
)

personal_type = linear_basics.personal_type   # re-exported (the rounds' parameters shadow it)
ROUND = "round"   # a linear process's one round kind
LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


class WeightsStep:
    """A stateless linear server step, w' = `new_weights`(w, Ā) with Ā the round's aggregate: the
    shape of a `tffl.engine.server_steps` step (`initialize`, `apply(state, w, update,
    round_num) -> (state, w')`). `new_weights` is a TF function of the model weights and the
    aggregate as their types hold them (e.g. float32[d, k]); it returns weights of that type."""

    def __init__(self, weights_type: tff.Type, update_type: tff.Type,
                 new_weights: Callable[[Any, tf.Tensor], Any]):
        @tff.tensorflow.computation
        def initialize():
            return collections.OrderedDict()

        @tff.tensorflow.computation(initialize.type_signature.result, weights_type, update_type,
                                    np.int32)
        def apply(state, weights, update, round_num):
            del round_num
            return state, new_weights(weights, update)

        self.initialize, self.apply = initialize, apply


def representation_step(representation_type: tff.TensorType, orthonormal: bool) -> WeightsStep:
    """The linear averaging round's server step: B' = P(Ā), Ā the aggregate of the uploaded B_i
    (P = `orthonormalize` (float64 QR) or the identity)."""

    def new_representation(representation, update):
        del representation
        if orthonormal:
            return tf.cast(orthonormalize(tf.cast(update, tf.float64)), tf.float32)
        return update

    return WeightsStep(representation_type, representation_type, new_representation)


@dataclasses.dataclass(frozen=True)
class LinearServer:
    """A linear process's server: B and the round's pieces other than the client work, and the
    state every linear process shares, TFF's

        LearningAlgorithmState(global_model_weights = B (float32[d, k]), distributor = (),
                               client_work = (), aggregator = {"round": aggregator state},
                               finalizer = {round_num, steps: {"round": {}}})    @SERVER

    (`tffl.engine.composition`'s, as for the Keras algorithms; see `build_server`).

    Attributes:
      dim, rank: d, k.
      representation_type: float32[d, k].
      data_type: one client's `OrderedDict(x=float32[None, d], y=float32[None])`.
      pieces: the averaging round's `RoundPieces` without client work (distributor, aggregator,
        server step), completed by `build_averaging_round`.
      initial_representation: () -> B⁰ (unplaced).
      state_type: the state's federated type (@SERVER).
      initialize: federated () -> state@SERVER with B⁰ and round_num 0.
      get_representation: (state) -> B (unplaced; a process's `get_model_weights`).
      set_representation: (state, float32[d, k]) -> state with that B (orthonormalized if the
        server is `orthonormal`), round_num kept (unplaced; a process's `set_model_weights`).
      orthonormalize: (float32[d, k]) -> its Q (float64 QR, signs as `orthonormalize`).
    """

    dim: int
    rank: int
    representation_type: tff.TensorType
    data_type: tff.Type
    pieces: engine.RoundPieces
    initial_representation: tff.Computation
    state_type: tff.FederatedType
    initialize: tff.Computation
    get_representation: tff.Computation
    set_representation: tff.Computation
    orthonormalize: tff.Computation

    def start(self, representation):
        """The initial state@SERVER with B = `representation` (@SERVER), inside a federated
        computation."""
        replace = _replace_representation(self.state_type.member, self.representation_type)
        return tff.federated_map(replace, tff.federated_zip((self.initialize(), representation)))

    def build_process(self, algorithm: str, next_computation: tff.Computation, *, config,
                      personal: process_lib.PersonalSpec | None = None,
                      traffic: communication.RoundTraffic | None = None) -> process_lib.Process:
        """A linear algorithm's `Process` on this server: its one round (`ROUND`,
        `next_computation`), started by `initialize`, model weights B (`get_representation`,
        `set_representation`), client data checked against d by `next_round`; `personal` (None:
        stateless, a TFF `LearningProcess`), the declared bytes per client `traffic` (used
        where TFF's forms cannot hold the round) and its typed `config`."""
        return process_lib.Process(
            process_lib.ProcessParts(
                algorithm, self.initialize, {ROUND: next_computation},
                get_model_weights=self.get_representation,
                set_model_weights=self.set_representation, personal=personal),
            process_lib.ProcessSupport(
                declared_traffic=None if traffic is None else {ROUND: traffic},
                check_data=data_checker(self.dim, algorithm), config=config))


def representation_of(state) -> tf.Tensor:
    """B of a linear server's state, inside a TF computation."""
    return state.global_model_weights


def advanced(state, representation):
    """The state after a round that ends at B = `representation`: round_num + 1, the rest kept
    (inside a TF computation; a two-exchange round's server update)."""
    finalizer = collections.OrderedDict(round_num=state.finalizer["round_num"] + 1,
                                        steps=state.finalizer["steps"])
    return LearningAlgorithmState(representation, state.distributor, state.client_work,
                                  state.aggregator, finalizer)


def _replace_representation(state_type: tff.Type, representation_type: tff.Type):
    @tff.tensorflow.computation(state_type, representation_type)
    def replace(state, representation):
        return LearningAlgorithmState(representation, state.distributor, state.client_work,
                                      state.aggregator, state.finalizer)

    return replace


def build_server(dim: int, rank: int, initial_representation: Callable[[], tf.Tensor],
                 orthonormal: bool, aggregator=None) -> LinearServer:
    """The server side of a linear process.

    Args:
      dim, rank: d, k (checked by the caller, e.g. `check_dims`).
      initial_representation: () -> float64 d×k tensor, B⁰ (traced into a TF computation; seed
        it, e.g. `gaussian`, so that `initialize` is deterministic).
      orthonormal: whether the process keeps B orthonormal: then the averaging round's server
        step and `set_representation` orthonormalize (QR); otherwise B is stored as is.
      aggregator: the averaging round's `tff.aggregators` factory for the B_i (default the
        unweighted mean `UnweightedMeanFactory()`, (1/n) Σ_i B_i, whatever the m_i; a weighted
        factory weights every client 1).
    """
    b_type = tff.TensorType(np.float32, [dim, rank])
    factory, _ = engine.weighted_factory(aggregator or tff.aggregators.UnweightedMeanFactory())

    @tff.tensorflow.computation
    def random_representation():
        return tf.cast(initial_representation(), tf.float32)

    @tff.tensorflow.computation(b_type)
    def server_orthonormalize(b):
        return tf.cast(orthonormalize(tf.cast(b, tf.float64)), tf.float32)

    pieces = engine.RoundPieces(
        ROUND, client_update=None,
        aggregator=factory.create(b_type, tff.TensorType(np.float32)),
        step=representation_step(b_type, orthonormal), traffic=None, upload_type=b_type,
        finalize_metrics=linear_train_metrics)
    initialize = composition.build_initialize([pieces], random_representation, b_type)
    state_type = initialize.type_signature.result

    @tff.tensorflow.computation(state_type.member)
    def get_representation(state):
        return state.global_model_weights

    @tff.tensorflow.computation(state_type.member, b_type)
    def with_representation(state, b):
        if orthonormal:
            b = tf.cast(orthonormalize(tf.cast(b, tf.float64)), tf.float32)
        return LearningAlgorithmState(b, state.distributor, state.client_work, state.aggregator,
                                      state.finalizer)

    return LinearServer(
        dim=dim, rank=rank, representation_type=b_type, data_type=data_type(dim),
        pieces=pieces, initial_representation=random_representation, state_type=state_type,
        initialize=initialize, get_representation=get_representation,
        set_representation=with_representation, orthonormalize=server_orthonormalize)


def build_mean_initializer(server: LinearServer, client_statistic: tff.Computation,
                           representation_from_mean: tff.Computation) -> tff.Computation:
    """`(data@CLIENTS) -> state@SERVER` with B⁰ = `representation_from_mean`((1/N) Σ_i s_i),
    s_i = `client_statistic`(data_i), and round_num 0 (e.g. FedRep's method of moments:
    s_i = (1/m_i) Σ_j y_ij² x_ij x_ijᵀ, B⁰ = its top-k eigenvectors)."""

    @tff.federated_computation(tff.FederatedType(server.data_type, tff.CLIENTS))
    def initialize_from_clients(data):
        mean = tff.federated_mean(tff.federated_map(client_statistic, data))
        return server.start(tff.federated_map(representation_from_mean, mean))

    return initialize_from_clients


def _round_client(server: LinearServer, client_update: tff.Computation,
                  personal_type: tff.Type | None) -> tff.Computation:
    """An algorithm's `client_update` ((B, data[, p]) -> {representation, loss[, personal]})
    as the engine's client work: `(B, data[, p]) -> (ClientResult(B_i, 1), {loss_sum: ℓ_i,
    num_clients: 1}, p_i')`."""

    def adapt(out):
        return client_result(out["representation"], out["loss"],
                             out["personal"] if personal_type is not None else None)

    if personal_type is None:
        @tff.tensorflow.computation(server.representation_type, server.data_type)
        def client(b, data):
            return adapt(client_update(b, data))
        return client

    @tff.tensorflow.computation(server.representation_type, server.data_type, personal_type)
    def personal_client(b, data, personal):
        return adapt(client_update(b, data, personal))

    return personal_client


def build_averaging_round(server: LinearServer, client_update: tff.Computation,
                          personal_type: tff.Type | None = None) -> tff.Computation:
    """The federated `next` of an averaging round, B' = P(A_{i∈I} B_i) (A the server's
    aggregator, the unweighted mean by default; P its server step): the server's pieces and
    this client work composed by `tffl.engine.composition.compose_kinds`, as every Keras round.

    Args:
      server: the process's `LinearServer`.
      client_update: (B, data[, personal]) -> `OrderedDict(representation=B_i, loss=ℓ_i)`, with a
        third entry `personal=p_i'` when `personal_type` is given (any key order).
      personal_type: the personal-state type (e.g. `personal_type(shapes)`), or None for a
        process without personal state.

    Returns:
      Without personal state: (state@SERVER, data@CLIENTS) -> `LearningProcessOutput(state,
      metrics)`; with it: (state@SERVER, data@CLIENTS, personal@CLIENTS) ->
      `PersonalizedOutput(state@SERVER, personal@CLIENTS, metrics@SERVER)`. Metrics: TFF's
      structure, `client_work/train` = {loss: (1/n) Σ_i ℓ_i, num_clients: n}.
    """
    client = _round_client(server, client_update, personal_type)
    pieces = dataclasses.replace(server.pieces, client_update=client)
    _, rounds = composition.compose_kinds(
        [pieces], server.initial_representation, server.representation_type, server.data_type,
        personal_type=personal_type)
    return rounds[ROUND]


def averaging_traffic(server: LinearServer, client_update: tff.Computation,
                      personal_type: tff.Type | None = None) -> communication.RoundTraffic:
    """Bytes per client of `build_averaging_round`, from the types that cross (for personalized
    rounds, which TFF's forms cannot hold): down B; up the `ClientResult` (B_i and its weight)
    and the metric sums (ℓ_i, 1)."""
    return communication.declared_traffic(
        server.representation_type, _round_client(server, client_update, personal_type))


# The process's Python-side helpers.

def get_representation(state) -> np.ndarray:
    """B (d×k, float32) of a linear process's state."""
    return np.asarray(state.global_model_weights)


def set_representation(process: process_lib.Process, state, representation):
    """A copy of `state` with B = `representation` (d×k, checked against `process.config`'s
    `dim` and `rank`), through `set_model_weights`: orthonormalized by processes that keep B
    orthonormal (FedRep, AdaptPFL's variant B), stored as is by the others."""
    shape, expected = np.shape(representation), (process.config.dim, process.config.rank)
    if shape != expected:
        raise ValueError(f"representation must have shape {expected}, got {shape}")
    return process.set_model_weights(state, np.asarray(representation, np.float32))
