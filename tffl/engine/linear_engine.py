"""The linear algorithms' server on the one engine (`fedrep_linear`, `flute_linear`,
`adaptpfl_linear`): the representation B, its server step, and the averaging round's pieces,
which `tffl.engine.process.build_process` composes as every Keras round.

A linear model. Client i holds a batch X_i ∈ R^{m_i×d}, y_i ∈ R^{m_i} and predicts ŷ = xᵀ θ_i,
where θ_i ∈ R^d is built from the shared representation B ∈ R^{d×k} (k ≤ d) and the client's
personal variables p_i (FedRep, FLUTE: θ_i = B w_i, p_i = w_i ∈ R^k; AdaptPFL:
θ_i = (1 − α) B w_i + α s_i, p_i = (w_i, s_i)). The losses are least squares,
(1/(2 m_i)) ‖X_i θ_i − y_i‖², so every step is a few matrix products: no Keras model is needed.

The *averaging round* (`LinearServer.averaging_round`, FedRep and AdaptPFL) is TFF's four pieces
over the participating clients I (|I| = n), as every Keras round:

1. distributor: the server broadcasts B (float32[d, k]);
2. client work: the algorithm's client computation on (B, X_i, y_i[, p_i]), returning
   `tffl.engine.linear_basics.client_result(B_i, ℓ_i[, p_i'])`: `ClientResult(B_i, 1)`, its
   loss ℓ_i at the start of the round, and its new personal state;
3. aggregator: a `tff.aggregators` factory, by default the unweighted mean (1/n) Σ_{i∈I} B_i
   whatever the m_i;
4. finalizer: `representation_step`, B' = P(Ā) with P the identity or `orthonormalize` (B̄ = QR,
   P(B̄) = Q with diag(R) ≥ 0); round_num t + 1.

Metrics, in TFF's structure: `client_work/train` holds `loss` = (1/n) Σ_{i∈I} ℓ_i and
`num_clients` = n (`linear_basics.linear_train_metrics`). Linear FLUTE's round (two exchanges
with the same clients) and RoLoRA's Alt-min-GD (two round kinds on (a, b)) build their own
pieces for the same composer (`tffl.algorithms.flute_linear`, `tffl.algorithms.rolora_linear`).

TFF placement and types (`tffl.engine.composition`'s state, as for the Keras algorithms):

    server state   LearningAlgorithmState(global_model_weights=float32[d, k],
                       distributor=(), client_work=(), aggregator={round: …},
                       finalizer={round_num=int32, steps={round: {}}})          @SERVER
    client data    OrderedDict(x=float32[m_i, d], y=float32[m_i])                @CLIENTS
    personal state OrderedDict(<name>=float32[shape], …)                         @CLIENTS

Client data are tensors, one value per client (not `tf.data` sequences: exact solves and full-
batch gradients need the whole batch at once); the type has shape [None, d], so m_i may differ.
Inside the `tff.tensorflow.computation`s the algebra runs in float64 (`linear_basics.batch64`);
results are cast back to float32 at the boundary.

A linear process is built by `build_process` from the server's `federated(personal)` (B⁰, the
data type, the personal state, and `set_model_weights`' QR when B is kept orthonormal): a TFF
`LearningProcess` whose model weights are B when stateless, else a personalized `Process`.
Python-side helpers: `get_representation`, `set_representation` (shape-checked).

Example (an averaging round: fixed unit heads w = 1_k, one gradient step on B, QR):

>>> from tffl.engine import linear_basics, process as process_lib
>>> server = build_server(10, 2, lambda: linear_basics.orthonormalize(
...     linear_basics.gaussian(10, 2, seed=0)), orthonormal=True)
>>> @tff.tensorflow.computation(server.representation_type, server.data_type)
... def client_update(b, data):
...     x64, y64, m = linear_basics.batch64(data)
...     r = tf.reduce_sum(x64 @ tf.cast(b, tf.float64), axis=1) - y64    # X B 1 − y  (m,)
...     step = tf.linalg.matvec(x64, r, transpose_a=True)[:, None] / m    # (d, 1), every column
...     return linear_basics.client_result(tf.cast(b, tf.float64) - 0.1 * step,
...                                        tf.reduce_sum(r**2) / (2.0 * m))
>>> process = process_lib.build_process("unit_heads", [server.averaging_round(client_update)],
...                                     server.federated())      # P: QR (orthonormal)
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

from tffl.engine import linear_basics
from tffl.engine import process as process_lib
from tffl.engine import rounds
from tffl.engine.personal_state import NO_PERSONAL_STATE, PersonalSpec

ROUND = "round"   # a linear process's one round kind


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


def _orthonormal32(b):
    """Q of B's float64 QR (`linear_basics.orthonormalize`), float32."""
    return tf.cast(linear_basics.orthonormalize(tf.cast(b, tf.float64)), tf.float32)


def representation_step(representation_type: tff.TensorType, orthonormal: bool) -> WeightsStep:
    """The linear averaging round's server step: B' = P(Ā), Ā the aggregate of the uploaded B_i
    (P = `orthonormalize` (float64 QR) or the identity)."""

    def new_representation(representation, update):
        del representation
        return _orthonormal32(update) if orthonormal else update

    return WeightsStep(representation_type, representation_type, new_representation)


@dataclasses.dataclass(frozen=True)
class LinearServer:
    """A linear process's server: B, its initial value, and the averaging round's pieces other
    than the client work (see `build_server`).

    Attributes:
      dim, rank: d, k.
      representation_type: float32[d, k].
      data_type: one client's `OrderedDict(x=float32[None, d], y=float32[None])`.
      initial_representation: () -> B⁰ (a TF computation).
      orthonormal: the averaging round and `set_model_weights` orthonormalize B (QR).
      aggregator: the averaging round's `tff.templates.AggregationProcess` of the B_i.
    """

    dim: int
    rank: int
    representation_type: tff.TensorType
    data_type: tff.Type
    initial_representation: tff.Computation
    orthonormal: bool
    aggregator: tff.templates.AggregationProcess

    def averaging_round(self, client_update: tff.Computation) -> rounds.RoundPieces:
        """The averaging round's pieces (module docstring) with `client_update`: `(B, data[,
        personal]) -> linear_basics.client_result(B_i, ℓ_i[, p_i'])`."""
        return rounds.RoundPieces(
            ROUND, client_update=client_update, aggregator=self.aggregator,
            step=representation_step(self.representation_type, self.orthonormal),
            finalize_metrics=linear_basics.linear_train_metrics)

    def federated(self, personal: PersonalSpec = NO_PERSONAL_STATE) -> process_lib.Federated:
        """What the server's round kinds share (`process_lib.Federated`): B⁰, the client data's
        type, `personal`, and `set_model_weights`' QR when B is kept orthonormal."""
        return process_lib.Federated(self.initial_representation, self.data_type, personal,
                                     stored=_orthonormal32 if self.orthonormal else None)


def build_server(dim: int, rank: int, initial_representation: Callable[[], tf.Tensor],
                 orthonormal: bool, aggregator=None) -> LinearServer:
    """The server side of a linear process.

    Args:
      dim, rank: d, k (checked by the caller, e.g. `linear_basics.check_dims`).
      initial_representation: () -> float64 d×k tensor, B⁰ (traced into a TF computation; seed
        it, e.g. `linear_basics.gaussian`, so that `initialize` is deterministic).
      orthonormal: whether the process keeps B orthonormal: then the averaging round's server
        step and `set_model_weights` orthonormalize (QR); otherwise B is stored as is.
      aggregator: the averaging round's `tff.aggregators` factory for the B_i (default the
        unweighted mean `UnweightedMeanFactory()`, (1/n) Σ_i B_i, whatever the m_i; a weighted
        factory weights every client 1).
    """
    b_type = tff.TensorType(np.float32, [dim, rank])
    factory, _ = rounds.weighted_factory(aggregator or tff.aggregators.UnweightedMeanFactory())

    @tff.tensorflow.computation
    def random_representation():
        return tf.cast(initial_representation(), tf.float32)

    return LinearServer(
        dim=dim, rank=rank, representation_type=b_type,
        data_type=linear_basics.data_type(dim), initial_representation=random_representation,
        orthonormal=orthonormal,
        aggregator=factory.create(b_type, tff.TensorType(np.float32)))


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
