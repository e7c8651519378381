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
* #8 / §1.6: variant A is Algorithm 1 (head → shortcut → representation, τ gradient steps
  each, no projection, no damping, no QR). Variant B (`variant="b"`) is the analysed
  iteration (2)–(8): exact ridge / least-squares solves, projection of s onto span(B)^⊥,
  damping λ_S, λ_W, one B step then QR, order S→W; each of these is a switch
  (`variant_b_update`).
* Initialization (undeclared in the draft): B⁰ a seeded random orthonormal d×k (or any B via
  `tffl.engine.linear_engine.set_representation`, e.g. FedRep's method-of-moments B⁰ from `tffl.algorithms.fedrep_linear`);
  w_i⁰ = 0 and s_i⁰ = 0 (§1.4; s⁰ = 0 is LoRA's zero-initialized branch).

α = 0 is FedRep with gradient heads, exactly: the shortcut gets zero gradient and never moves,
θ_i = B w_i, and the round is "τ_w head GD steps with B fixed, then τ_b local GD steps on B with
the new head, then the plain mean of the B_i" — FedRep's Algorithm 1 with GRD = one full-batch
gradient step, warm-started heads and no QR. (The shortcut terms vanish exactly in floating
point — (1 − 0)·Bw + 0·s = Bw — so these are FedRep's iterates, not an approximation of them.)
α = 1 is local linear regression on s alone: B and w receive zero gradient.

Client data: one value per client, `OrderedDict(x=float32[m_i, d], y=float32[m_i])` (a full
batch; fresh samples per round, as the draft's theory wants, are the caller's). Personal state:
`OrderedDict(head=float32[k], shortcut=float32[d])`. The algebra runs in float64 inside the
client computation; results are cast to float32. Steps 1 and 3 are
`tffl.engine.linear_engine`'s averaging round (no QR), composed by the engine's one composer;
this module writes only the client update, step 2. Metrics (TFF's structure, `client_work/train`): `loss` = mean over
clients of f_i (without the ridge) at the start of the round; `num_clients`.

`build_adaptpfl_linear(config)` (an `AdaptPFLLinearConfig`) returns a personalized
`tffl.engine.process.Process` whose model weights are B (`set_model_weights` stores B as is in
variant A, orthonormalized in variant B); its `config` is `config`, defaults filled in.
Functions: `predictors(process, state, personal_states)`; B itself is read and set by
`tffl.engine.linear_engine.get_representation(state)` and `set_representation(process, state,
b)` (shape-checked).

Example:

>>> process = build_adaptpfl_linear(AdaptPFLLinearConfig(
...     dim=10, rank=2, alpha=0.3, learning_rate=0.1, head_steps=10, shortcut_steps=10,
...     representation_steps=1))
>>> personal = [process.initialize_personal(f"client_{i}") for i in range(len(data))]
>>> with runtime.local_runtime():                     # `data`: 4 clients' (x, y), d = 10
...     state = process.initialize()
...     output = process.next_round(state, data, personal)
...     state, personal = output.state, output.personal_states
>>> thetas = predictors(process, state, personal)    # (N, d): row i is θ_i
>>> thetas.shape
(4, 10)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import linear_basics, linear_engine
from tffl.engine import process as process_lib


def _gradient_descent(steps: int, value: tf.Tensor, step_fn) -> tf.Tensor:
    """`steps` iterations value ← step_fn(value) (a `tf.while_loop`; 0 steps returns value)."""
    if steps == 0:
        return value
    _, result = tf.while_loop(
        lambda i, v: i < steps, lambda i, v: (i + 1, step_fn(v)),
        (tf.constant(0), value))
    return result


def _server(dim: int, rank: int, seed: int, orthonormal: bool):
    """The averaging round's server (B⁰ a seeded random orthonormal d×k; `orthonormal`: QR after
    each mean, variant B) and the personal-state type (w_i, s_i)."""
    server = linear_engine.build_server(
        dim, rank, lambda: linear_basics.orthonormalize(linear_basics.gaussian(dim, rank, seed)),
        orthonormal=orthonormal)
    return server, linear_basics.personal_type(personal_shapes(dim, rank))


def _client_inputs(b, data, personal):
    """(B, X, y, m, w_i, s_i) of one client's round, float64."""
    x64, y64, m = linear_basics.batch64(data)
    return (tf.cast(b, tf.float64), x64, y64, m, tf.cast(personal["head"], tf.float64),
            tf.cast(personal["shortcut"], tf.float64))


def _client_output(representation, w, s, loss):
    """What a client returns to the averaging round (`linear_basics.client_result`): B_i, its
    loss, its new (w_i, s_i) (float32)."""
    return linear_basics.client_result(
        representation, loss, collections.OrderedDict(head=tf.cast(w, tf.float32),
                                                      shortcut=tf.cast(s, tf.float32)))


def _nonnegative_int(name: str, value: int) -> int:
    if int(value) != value or value < 0:
        raise ValueError(f"{name}={value} must be an integer >= 0")
    return int(value)


@dataclasses.dataclass(frozen=True)
class AdaptPFLLinearConfig:
    """Linear AdaptPFL's configuration: what `build_adaptpfl_linear` takes, and (with its defaults
    filled in) a process's `config`.

    Attributes:
      dim, rank: d >= 1 and k, 1 <= k <= d.
      alpha: α in [0, 1] (0: FedRep with gradient heads; 1: local regression on s).
      learning_rate: η_b > 0, the step of the representation phase (and the default of the
        other two).
      head_steps, shortcut_steps, representation_steps: τ_w, τ_s, τ_b >= 0, the gradient steps
        per round on the head, on the shortcut and (local steps) on B.
      head_learning_rate, shortcut_learning_rate: η_w, η_s > 0 (None: η_b; the draft has one η).
      shortcut_ridge: β >= 0, weight decay (β/2)‖s‖² in the shortcut phase (the draft's β of
        eq. 2, per client; 0 by default as in Algorithm 1).
      seed: seed of `initialize`'s random orthonormal B.
      variant: "a" (Algorithm 1 repaired) or "b" (the analysed iteration (2)–(8),
        `variant_b_update`). Variant B's ablation switches (ignored by A):
      project_shortcut: (3), s̄ = (I − B̂B̂ᵀ) s̃ (default on).
      shortcut_damping, head_damping: λ_S, λ_W in (0, 1] of (4) and (6) (the draft's γ = λ_W).
      order: "sw" (the analysis: shortcut, then head) or "ws" (Algorithm 1's order).

    Variant B's representation step is one gradient step (η = `learning_rate`) then QR; its
    ridge is `shortcut_ridge` (β̃, per client). A process's `config` has η_w and η_s filled in
    (variant B: η_w = η_s = η_b, τ_w = τ_s = 0, τ_b = 1, the steps it runs).
    """

    dim: int
    rank: int
    alpha: float
    learning_rate: float
    head_steps: int = 10
    shortcut_steps: int = 10
    representation_steps: int = 1
    head_learning_rate: float | None = None
    shortcut_learning_rate: float | None = None
    shortcut_ridge: float = 0.0
    seed: int = 0
    variant: str = "a"
    project_shortcut: bool = True
    shortcut_damping: float = 1.0
    head_damping: float = 1.0
    order: str = "sw"


def personal_shapes(dim: int, rank: int) -> collections.OrderedDict:
    """One client's personal state: its head w_i (k,) and shortcut s_i (d,)."""
    return collections.OrderedDict(head=(rank,), shortcut=(dim,))


def initial_personal(config: AdaptPFLLinearConfig, client_id: Any) -> collections.OrderedDict:
    """Every client starts at w⁰ = 0, s⁰ = 0 (`client_id` is not needed)."""
    del client_id
    return collections.OrderedDict(head=np.zeros(config.rank, np.float32),
                                   shortcut=np.zeros(config.dim, np.float32))


def predictors(process: process_lib.Process, state, personal_states) -> np.ndarray:
    """θ_i = (1 − α) B w_i + α s_i for every client (N×d, float64; row i is client i's)."""
    alpha = process.config.alpha
    b = linear_engine.get_representation(state).astype(np.float64)
    heads = linear_basics.stack_personal(personal_states, "head")
    shortcuts = linear_basics.stack_personal(personal_states, "shortcut")
    return (1.0 - alpha) * heads @ b.T + alpha * shortcuts


def _process(server, client_update, config: AdaptPFLLinearConfig) -> process_lib.Process:
    """The process of `server`'s averaging round with `client_update`, personal (w_i, s_i)."""
    personal = linear_basics.personal_spec(personal_shapes(config.dim, config.rank),
                                           functools.partial(initial_personal, config))
    return process_lib.build_process(
        "adaptpfl_linear", [server.averaging_round(client_update)], server.federated(personal),
        support=process_lib.ProcessSupport(
            check_data=linear_basics.data_checker(config.dim, "adaptpfl_linear"),
            config=config))


def build_adaptpfl_linear(config: AdaptPFLLinearConfig) -> process_lib.Process:
    """Linear AdaptPFL: θ_i = (1 − α) B w_i + α s_i; variant A (Algorithm 1 repaired, the module
    docstring) or variant B (the draft's analysed iteration, `variant_b_update`), as `config`
    (`AdaptPFLLinearConfig`) says.

    Returns:
      The personalized `Process` (module docstring); its `config`: `config`, defaults filled in.

    Raises:
      ValueError: d < 1, k outside [1, d], α outside [0, 1], a step size <= 0, a step count that
        is negative or not an integer, β < 0, or a non-finite value; the message names the value.
        Variant B: α = 1, a damping outside (0, 1], an unknown order.
    """
    dim, rank = linear_basics.check_dims(config.dim, config.rank)
    checked = _checked(dataclasses.replace(config, dim=dim, rank=rank))
    if checked.variant == "b":
        return _build_variant_b(checked)
    return _build_variant_a(checked)


def _checked(config: AdaptPFLLinearConfig) -> AdaptPFLLinearConfig:
    """`config`'s hyperparameters checked (`build_adaptpfl_linear`'s Raises, in field order), the
    defaults η_w = η_s = η_b filled in."""
    check_rate = linear_basics.check_rate
    alpha = float(config.alpha)
    if not (np.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha={alpha} must be in [0, 1]")
    eta_b = check_rate("learning_rate", config.learning_rate)
    eta_w = check_rate("head_learning_rate", eta_b if config.head_learning_rate is None
                       else config.head_learning_rate)
    eta_s = check_rate("shortcut_learning_rate", eta_b if config.shortcut_learning_rate is None
                       else config.shortcut_learning_rate)
    checked = dataclasses.replace(
        config, alpha=alpha, learning_rate=eta_b, head_learning_rate=eta_w,
        shortcut_learning_rate=eta_s,
        head_steps=_nonnegative_int("head_steps", config.head_steps),
        shortcut_steps=_nonnegative_int("shortcut_steps", config.shortcut_steps),
        representation_steps=_nonnegative_int("representation_steps",
                                              config.representation_steps),
        shortcut_ridge=check_rate("shortcut_ridge", config.shortcut_ridge, allow_zero=True))
    if config.variant not in VARIANTS:
        raise ValueError(f"variant={config.variant!r} must be one of {', '.join(VARIANTS)}")
    return checked


def _build_variant_a(config: AdaptPFLLinearConfig) -> process_lib.Process:
    """Variant A (module docstring, step 2): τ_w head, τ_s shortcut and τ_b representation
    gradient steps at the client, then the plain mean of the B_i (no QR); `config` checked."""
    alpha, beta = config.alpha, config.shortcut_ridge
    eta_b, eta_w = config.learning_rate, config.head_learning_rate
    eta_s = config.shortcut_learning_rate
    tau_w, tau_s, tau_b = config.head_steps, config.shortcut_steps, config.representation_steps
    server, personal_type = _server(config.dim, config.rank, config.seed, orthonormal=False)

    @tff.tensorflow.computation(server.representation_type, server.data_type, personal_type)
    def client_update(b, data, personal):
        """(B, data, (w_i, s_i)) -> {representation: B_i, personal: (w_i', s_i'), loss}."""
        b64, x64, y64, m, w0, s0 = _client_inputs(b, data, personal)

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
        return _client_output(b_i, w, s, loss)

    return _process(server, client_update, config)


VARIANTS = ("a", "b")
ORDERS = ("sw", "ws")


def variant_b_update(x64, y64, b64, w0, s0, config: AdaptPFLLinearConfig):
    """One client's step of the analysed iteration (adaptpfl.md §1.5, per-client form), float64.

    With Π = XᵀX/m, B̂ the broadcast (orthonormal) representation, and from `config` α = `alpha`,
    β̃ = `shortcut_ridge`, λ_S = `shortcut_damping`, λ_W = `head_damping`:

        (2) s̃ = α (α² Π + β̃ I)⁺ (1/m) Xᵀ (y − (1−α) X B̂ w)         ridge shortcut
        (3) s̄ = (I − B̂B̂ᵀ) s̃                                      (if `project_shortcut`)
        (4) s' = (1−λ_S) s + λ_S s̄
        (5) w̄ = (1/(1−α)) (B̂ᵀΠB̂)⁺ B̂ᵀ (1/m) Xᵀ (y − α X s̄)         least-squares head
        (6) w' = (1−λ_W) w + λ_W w̄
        (7) G = −((1−α)/m) Xᵀ (y − X((1−α) B̂ w' + α s')) w'ᵀ

    Order "sw" is (2)–(6) as written (the head uses the projected, undamped s̄); "ws" solves the
    head first against the stored s, then the shortcut against the new head. ⁺ is the
    pseudo-inverse (m < k or α = β̃ = 0 make the matrices singular). x64 (m, d), y64 (m,),
    b64 (d, k), w0 (k,), s0 (d,); returns (w' (k,), s' (d,), G (d, k)).

    Example (one client, m = 8, d = 4, k = 2; undamped and projected, s' ⟂ span(B̂)):

    >>> rng = np.random.default_rng(0)
    >>> x, y, b = rng.normal(size=(8, 4)), rng.normal(size=8), rng.normal(size=(4, 2))
    >>> b = np.linalg.qr(b)[0]                                # B̂: orthonormal columns
    >>> config = AdaptPFLLinearConfig(4, 2, alpha=0.3, learning_rate=0.1, shortcut_ridge=0.05,
    ...                               variant="b")
    >>> w, s, grad = variant_b_update(x, y, b, np.zeros(2), np.zeros(4), config)
    >>> w.shape, s.shape, grad.shape
    (TensorShape([2]), TensorShape([4]), TensorShape([4, 2]))
    >>> bool(np.allclose(b.T @ s.numpy(), 0.0))
    True
    """
    alpha, beta, order = config.alpha, config.shortcut_ridge, config.order
    damping_s, damping_w = config.shortcut_damping, config.head_damping
    m = tf.cast(tf.shape(x64)[0], tf.float64)
    d = tf.shape(b64)[0]
    gram = tf.matmul(x64, x64, transpose_a=True) / m                        # Π (d×d)

    def shortcut(w):
        target = y64 - (1.0 - alpha) * tf.linalg.matvec(x64, tf.linalg.matvec(b64, w))
        rhs = tf.linalg.matvec(x64, target, transpose_a=True) / m
        s_tilde = alpha * tf.linalg.matvec(
            tf.linalg.pinv(alpha**2 * gram + beta * tf.eye(d, dtype=tf.float64)), rhs)
        if config.project_shortcut:
            s_tilde = s_tilde - tf.linalg.matvec(b64, tf.linalg.matvec(b64, s_tilde,
                                                                       transpose_a=True))
        return s_tilde

    def head(s_bar):
        rhs = tf.linalg.matvec(b64, tf.linalg.matvec(x64, y64 - alpha * tf.linalg.matvec(
            x64, s_bar), transpose_a=True) / m, transpose_a=True)
        small = tf.matmul(b64, tf.matmul(gram, b64), transpose_a=True)       # B̂ᵀΠB̂ (k×k)
        return tf.linalg.matvec(tf.linalg.pinv(small), rhs) / (1.0 - alpha)

    if order == "sw":
        s_bar = shortcut(w0)
        s_new = (1.0 - damping_s) * s0 + damping_s * s_bar
        w_new = (1.0 - damping_w) * w0 + damping_w * head(s_bar)
    else:
        w_new = (1.0 - damping_w) * w0 + damping_w * head(s0)
        s_new = (1.0 - damping_s) * s0 + damping_s * shortcut(w_new)
    theta = (1.0 - alpha) * tf.linalg.matvec(b64, w_new) + alpha * s_new
    residual = y64 - tf.linalg.matvec(x64, theta)
    grad = -((1.0 - alpha) / m) * (tf.linalg.matvec(x64, residual, transpose_a=True)[:, None]
                                   * w_new[None, :])
    return w_new, s_new, grad


def _build_variant_b(config: AdaptPFLLinearConfig) -> process_lib.Process:
    """Variant B (`variant_b_update` at the client; the mean of B̂ − ηG_i, then QR); `config`
    checked by `_checked`, its switches here."""
    alpha, eta = config.alpha, config.learning_rate
    if not alpha < 1.0:
        raise ValueError(f"alpha={alpha}: variant B solves the head with a 1/(1−α) factor; "
                         "it needs alpha < 1")
    for name in ("shortcut_damping", "head_damping"):
        value = getattr(config, name)
        if not (np.isfinite(value) and 0.0 < value <= 1.0):
            raise ValueError(f"{name}={value} must be in (0, 1]")
    if config.order not in ORDERS:
        raise ValueError(f"order={config.order!r} must be one of {', '.join(ORDERS)}")
    server, personal_type = _server(config.dim, config.rank, config.seed, orthonormal=True)

    @tff.tensorflow.computation(server.representation_type, server.data_type, personal_type)
    def client_update(b, data, personal):
        """(B̂, data, (w_i, s_i)) -> {representation: B̂ − η G_i, personal: (w_i', s_i'), loss}."""
        b64, x64, y64, m, w0, s0 = _client_inputs(b, data, personal)
        theta0 = (1.0 - alpha) * tf.linalg.matvec(b64, w0) + alpha * s0
        loss = tf.reduce_sum((tf.linalg.matvec(x64, theta0) - y64) ** 2) / (2.0 * m)
        w, s, grad = variant_b_update(x64, y64, b64, w0, s0, config)
        return _client_output(b64 - eta * grad, w, s, loss)

    # (7)–(8): the mean of B̂ − ηG_i is B̂ − η·mean(G_i), one step; then QR.
    return _process(server, client_update, dataclasses.replace(
        config, head_learning_rate=eta, shortcut_learning_rate=eta, head_steps=0,
        shortcut_steps=0, representation_steps=1))
