"""Linear FedRep (SRPFL Algorithm 2 without doubling) as TFF federated computations.

Model (`shared/specs/srpfl.md` §4.1): client i has y = w_i*ᵀ B*ᵀ x + z, B* ∈ R^{d×k} orthonormal,
w_i* ∈ R^k its personal head. Client i's round-t objective on its batch X_i ∈ R^{m_i×d},
y_i ∈ R^{m_i} is (srpfl.md §2.3)

    f̂_i(w, B) = (1/(2 m_i)) ‖X_i B w − y_i‖².

One round (`next`, srpfl.md §2.3 main loop and eqs. 16–18, FedRep §6.1 with τ_φ = 1):

1. the server broadcasts B (d×k, orthonormal columns);
2. client i solves its head exactly, w_i = argmin_w f̂_i(w, B) (least squares; the minimum-norm
   solution if X_i B is rank deficient), which equals ((1/m) BᵀX_iᵀX_iB)⁻¹ (1/m) BᵀX_iᵀy_i;
3. client i takes one gradient step on B with w_i frozen,
   B_i = B − η ∇_B f̂_i(w_i, B),  ∇_B f̂_i = (1/m_i) X_iᵀ (X_i B w_i − y_i) w_iᵀ   (d×k);
4. the server takes the *unweighted* mean B̄ = (1/n) Σ_i B_i (`tff.federated_mean`) and
   orthonormalizes, B ← Q of B̄ = QR with the signs fixed so that diag(R) ≥ 0.

Personal state: none. In Algorithm 2 the head is recomputed *exactly* from the broadcast B and
the round's batch ("exact head minimization", τ_h → ∞), so the previous w_i is never read: TFF's
stateless clients lose nothing, and the server state is only B and the round count. (The generic
Algorithm 1 / neural FedRep warm-starts heads from the stored h_i; that variant is not this file.)
Fresh samples per round (Algorithm 2 samples a new batch each round) are the caller's business:
pass new (X_i, y_i) to each `next`.

Client data: one value per client, an `OrderedDict(x=float32[m_i, d], y=float32[m_i])` of
tensors, m_i >= 1 (not a `tf.data` sequence: the exact head solve needs the whole batch at once).
m_i may differ between clients; the server mean stays unweighted, as in the paper. The state,
round counter, checks and the averaging round (steps 1 and 4) are `tffl.engine.linear_engine`'s; inside
the client computation the algebra runs in float64 and results are cast back to float32.

Method-of-moments initialization (srpfl.md §2.3 "Initialization", §5.2): client i uploads
P_i = (1/m_i) Σ_j y_ij² x_ij x_ijᵀ (d×d); the server forms (1/N) Σ_i P_i (= (1/(Nm)) Σ_i Σ_j
y_ij² x_ij x_ijᵀ for equal m) and B⁰ = its top-k eigenvectors (`tf.linalg.eigh`, d×k). Use a
separate batch from the first round's (as the paper does).

Metrics of a round (at the server, in TFF's structure under `client_work/train`): `loss` =
(1/n) Σ_i f̂_i(w_i, B), the mean client objective at the exact heads and the *broadcast* B
(before the step); `num_clients` = n. The subspace distance to B* is the caller's (tffl has no
ground truth): e.g. `tasks.subspace.principal_angle_distance`.

The process. `build_fedrep_linear` returns a `tffl.engine.process.Process`, a TFF
`LearningProcess` (`next: (S@SERVER, {D}@CLIENTS) -> LearningProcessOutput`) whose model weights
are B: `get_model_weights(state)` is B (float32[d, k]) and `set_model_weights(state, B)`
orthonormalizes B. Its `config` is a `FedRepLinearConfig` (the hyperparameters, the method of
moments and the head computations). The module's functions: `initialize_by_moments(process,
data)` and `head(process, b, data)`; B itself is read and set by
`tffl.engine.linear_engine.get_representation(state)` and `set_representation(process, state,
b)` (shape-checked).

Example:

>>> process = build_fedrep_linear(dim=10, rank=2, learning_rate=0.5)
>>> data = [collections.OrderedDict(x=x_i, y=y_i) for x_i, y_i in zip(xs, ys)]  # 4 clients
>>> with runtime.local_runtime():
...     state = initialize_by_moments(process, data)     # or process.initialize()
...     output = process.next_round(state, data)
...     b = linear_engine.get_representation(output.state)   # float32 (d, k)
>>> b.shape, bool(np.allclose(b.T @ b, np.eye(2), atol=1e-5))   # QR: orthonormal columns
((10, 2), True)
>>> isinstance(process, tff.learning.templates.LearningProcess)
True
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import composition, linear_basics, linear_engine
from tffl.engine import process as process_lib


def _head(b64: tf.Tensor, x64: tf.Tensor, y64: tf.Tensor) -> tf.Tensor:
    """w = argmin_w ‖X B w − y‖² (k,), float64, via `tf.linalg.lstsq` (orthogonal decomposition,
    minimum-norm solution when X B is rank deficient)."""
    return tf.linalg.lstsq(x64 @ b64, y64[:, tf.newaxis], fast=False)[:, 0]


@dataclasses.dataclass(frozen=True)
class FedRepLinearConfig:
    """Linear FedRep's configuration (a process's `config`).

    Attributes:
      dim, rank: d, k.
      learning_rate: η.
      seed: the seed of `initialize`'s random B.
      client_moments: data -> float32[d, d], one client's P_i = (1/m_i) Σ_j y_ij² x_ij x_ijᵀ.
      top_eigenvectors: float32[d, d] -> float32[d, k], a symmetric matrix's top-k
        eigenvectors (the method of moments' B⁰ from (1/N) Σ_i P_i, `initialize_by_moments`).
      head: (float32[d, k], data) -> float32[k], one client's exact head (`head`).
    """

    dim: int
    rank: int
    learning_rate: float
    seed: int
    client_moments: tff.Computation
    top_eigenvectors: tff.Computation
    head: tff.Computation


def initialize_by_moments(process: process_lib.Process, client_data):
    """State with B⁰ = top-k eigenvectors of (1/N) Σ_i (1/m_i) Σ_j y_ij² x_ij x_ijᵀ (the
    clients' data checked first), round_num 0."""
    linear_basics.data_checker(process.config.dim, process.algorithm)(client_data)
    return composition.initialize_from_clients(
        process.initialize, process.config.client_moments,
        process.config.top_eigenvectors)(client_data)


def head(process: process_lib.Process, representation, data) -> np.ndarray:
    """One client's exact head w = argmin_w ‖X B w − y‖² for B = `representation` (float32[k];
    for personalization and evaluation with a learned B)."""
    return process.config.head(np.asarray(representation, np.float32), data)


def build_fedrep_linear(dim: int, rank: int, learning_rate: float, seed: int = 0
                        ) -> process_lib.Process:
    """Linear FedRep (SRPFL Algorithm 2, no doubling): d = `dim`, k = `rank`, η = `learning_rate`.

    Args:
      dim: d ≥ 1, the feature dimension.
      rank: k, 1 ≤ k ≤ d, the representation dimension.
      learning_rate: η > 0, the step on B of the (1/m)-normalized gradient (srpfl.md §5.2 suggests
        0.1–0.5; the theory needs η ≤ 1/(8 σ̄²_max,*)).
      seed: seed of `initialize`'s random B.

    Returns:
      The stateless `Process` (module docstring); `config` a `FedRepLinearConfig`.

    Raises:
      ValueError: d < 1, k ≤ 0 or k > d, or η ≤ 0 (or not finite).
    """
    dim, rank = linear_basics.check_dims(dim, rank)
    eta = linear_basics.check_rate("learning_rate", learning_rate)
    server = linear_engine.build_server(
        dim, rank, lambda: linear_basics.orthonormalize(linear_basics.gaussian(dim, rank, seed)),
        orthonormal=True)
    b_type, data_type = server.representation_type, server.data_type

    @tff.tensorflow.computation(b_type, data_type)
    def exact_head(b, data):
        x64, y64, _ = linear_basics.batch64(data)
        return tf.cast(_head(tf.cast(b, tf.float64), x64, y64), tf.float32)

    @tff.tensorflow.computation(b_type, data_type)
    def client_update(b, data):
        """(B, {X_i, y_i}) -> B_i and f̂_i(w_i, B), as `linear_basics.client_result`."""
        b64 = tf.cast(b, tf.float64)
        x64, y64, m = linear_basics.batch64(data)
        w = _head(b64, x64, y64)                                    # (k,)
        residual = tf.linalg.matvec(x64 @ b64, w) - y64             # (m,)
        grad = (tf.linalg.matvec(x64, residual, transpose_a=True)[:, tf.newaxis]
                * w[tf.newaxis, :]) / m                             # (d, k)
        return linear_basics.client_result(b64 - eta * grad,
                                           tf.reduce_sum(residual**2) / (2.0 * m))

    @tff.tensorflow.computation(data_type)
    def client_moments(data):
        """P_i = (1/m_i) Σ_j y_ij² x_ij x_ijᵀ (d×d)."""
        x64, y64, m = linear_basics.batch64(data)
        p = tf.linalg.matmul(x64 * (y64**2)[:, tf.newaxis], x64, transpose_a=True) / m
        return tf.cast(p, tf.float32)

    @tff.tensorflow.computation(tff.TensorType(np.float32, [dim, dim]))
    def top_eigenvectors(p):
        """The top-k eigenvectors (d×k, by decreasing eigenvalue) of the symmetric p."""
        p64 = tf.cast(p, tf.float64)
        _, vectors = tf.linalg.eigh(0.5 * (p64 + tf.transpose(p64)))  # ascending eigenvalues
        return tf.cast(tf.reverse(vectors[:, dim - rank:], axis=[1]), tf.float32)

    config = FedRepLinearConfig(dim=dim, rank=rank, learning_rate=eta, seed=int(seed),
                                client_moments=client_moments,
                                top_eigenvectors=top_eigenvectors, head=exact_head)
    return process_lib.build_process(
        "fedrep_linear", [server.averaging_round(client_update)], server.federated(),
        support=process_lib.ProcessSupport(
            check_data=linear_basics.data_checker(dim, "fedrep_linear"), config=config))
