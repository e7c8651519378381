"""AdaptPFL's client phases on Keras models: variant A (Algorithm 1) and variant B (the draft's
analysed iteration, adaptpfl.md §1.4–1.6), for `personalized.build_personalized_process`.

Client i's model mixes the representation path and a personal linear shortcut S_i (d×C, role
`shortcut`, `models.paper_models.ShortcutMix`): logits = (1−α)·h_i(φ(x)) + α·x S_i. With a
linear φ(x) = x W this is the draft's θ_i = (1−α) W w_i + α s_i. One round on client i, from
the stored (h_i, S_i) and the broadcast φ (each phase: τ epochs of the client optimizer):

Variant A (`order="ws"`, Algorithm 1 repaired):

    h_i ← τ_w epochs on h_i;  S_i ← τ_s epochs on S_i (+ β·S_i);  φ ← τ_b epochs on φ

Variant B (`order="sw"` by default, eqs. (2)–(8) with gradient phases for the exact solves):

    S̃  ← τ_s epochs on S_i from S_i^t (+ β·S_i: the ridge of (2))
    S̄  = (I − Q Qᵀ) S̃,  Q = orth(W), W (d×h, h < d) the representation kernel that reads x  (3)
    h̄  ← τ_w epochs on h_i from h_i^t with S̄                                            (5)
    S_i^{t+1} = (1−λ_S) S_i^t + λ_S S̄,   h_i^{t+1} = (1−λ_W) h_i^t + λ_W h̄                (4), (6)
    φ  ← τ_b epochs on φ with (h_i^{t+1}, S_i^{t+1})                                      (7)

`order="ws"` in variant B runs the head first (the shortcut then sees h̄), projects after the
shortcut phase and damps both after the second phase. Not carried over from the linear
analysis (`tffl.algorithms.adaptpfl_linear` has them): the exact ridge and least-squares solves (a
cross-entropy has no closed form, so τ gradient epochs stand for them) and the QR of B (φ is
not an orthonormal basis).

>>> AdaptPFLConfig(variant="b").order, AdaptPFLConfig().order
('sw', 'ws')
>>> AdaptPFLConfig(variant="b", shortcut_damping=0.0)
Traceback (most recent call last):
ValueError: shortcut_damping=0.0 must be in (0, 1] (λ_S of the draft's eq. 4; 1: no damping)
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from tffl.engine import client_training

VARIANTS = ("a", "b")
ORDERS = ("ws", "sw")


@dataclasses.dataclass(frozen=True)
class AdaptPFLConfig:
    """AdaptPFL's variant and its ablation switches (the names of `scripts/train.py`'s flags).

    `variant`: "a" or "b" (module docstring). `order`: "ws" (head, then shortcut: Algorithm 1)
    or "sw" (the analysis); default "ws" for A, "sw" for B. `shortcut_ridge`: β ≥ 0, coupled L2
    on S_i in its phase (both variants); β > 0 replaces the client weight decay in that phase,
    β = 0 leaves it. Variant B only: `project_shortcut` (eq. 3), `shortcut_damping` λ_S and
    `head_damping` λ_W in (0, 1] (eqs. 4 and 6; the draft's γ taken equal to λ_W)."""

    variant: str = "a"
    order: str | None = None
    shortcut_ridge: float = 0.0
    project_shortcut: bool = True
    shortcut_damping: float = 1.0
    head_damping: float = 1.0

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"adaptpfl variant={self.variant!r} must be one of "
                             f"{', '.join(VARIANTS)}")
        if self.order is None:
            object.__setattr__(self, "order", "sw" if self.variant == "b" else "ws")
        if self.order not in ORDERS:
            raise ValueError(f"adaptpfl order={self.order!r} must be one of {', '.join(ORDERS)} "
                             "(ws: head then shortcut; sw: shortcut then head)")
        if not (math.isfinite(self.shortcut_ridge) and self.shortcut_ridge >= 0):
            raise ValueError(f"shortcut_ridge={self.shortcut_ridge} must be a finite number >= 0")
        for name, eq in (("shortcut_damping", "λ_S of the draft's eq. 4"),
                         ("head_damping", "λ_W of the draft's eq. 6")):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}={value} must be in (0, 1] ({eq}; 1: no damping)")
        if self.variant == "a" and (self.shortcut_damping != 1.0 or self.head_damping != 1.0):
            raise ValueError(f"shortcut_damping={self.shortcut_damping}, head_damping="
                             f"{self.head_damping}: damping is variant B's step (eqs. 4, 6); "
                             "use variant='b'")


def projection_kernels(spec, shortcut: tuple[int, ...], representation: tuple[int, ...]
                       ) -> tuple[int, int]:
    """The positions of the shortcut kernel S (d×C) and of W, the first representation kernel
    that reads the same input (shape (d, h)), whose span eq. (3) projects out of S."""
    kernels = [k for k in shortcut if len(spec.trainable[k].shape) == 2]
    if len(kernels) != 1:
        raise ValueError("adaptpfl variant b projects one shortcut kernel, found "
                         f"{[spec.trainable[k].name for k in kernels]}")
    d = spec.trainable[kernels[0]].shape[0]
    for k in representation:
        shape = spec.trainable[k].shape
        if len(shape) == 2 and shape[0] == d:
            if shape[1] >= d:
                raise ValueError(
                    f"adaptpfl variant b projects the shortcut onto span({spec.trainable[k].name})"
                    f"'s complement, but that kernel is {shape[0]}×{shape[1]}: its span is all of "
                    f"R^{d}; use project_shortcut=False")
            return kernels[0], k
    raise ValueError(f"adaptpfl variant b projects the shortcut onto the span of the "
                     f"representation kernel that reads its {d}-dimensional input, and the model "
                     "has none; use project_shortcut=False")


def _project(shortcut_kernel: int, basis_kernel: int):
    def after(variables, start):
        del start
        q, _ = tf.linalg.qr(variables[basis_kernel])           # d×h, orthonormal columns
        s = variables[shortcut_kernel]
        s.assign(s - tf.matmul(q, tf.matmul(q, s, transpose_a=True)))
    return after


def _damp(groups):
    """`groups`: (indices, λ) pairs; each variable ← (1−λ)·its start + λ·its value."""
    def after(variables, start):
        for indices, lam in groups:
            if lam == 1.0:
                continue
            for k in indices:
                variables[k].assign((1.0 - lam) * start[k] + lam * variables[k])
    return after


def _chain(*functions):
    functions = [f for f in functions if f is not None]
    if not functions:
        return None

    def after(variables, start):
        for f in functions:
            f(variables, start)
    return after


def phases(config: AdaptPFLConfig, spec, head, shortcut, representation, head_epochs: int,
           shortcut_epochs: int, representation_epochs: int
           ) -> tuple[client_training.Phase, ...]:
    """The round's phases of `config` (module docstring) for the trainable positions given."""
    ridge = float(config.shortcut_ridge) or None
    project = None
    damp = None
    if config.variant == "b":
        if config.project_shortcut:
            project = _project(*projection_kernels(spec, shortcut, representation))
        if config.shortcut_damping != 1.0 or config.head_damping != 1.0:
            damp = _damp(((shortcut, config.shortcut_damping), (head, config.head_damping)))
    head_phase = client_training.Phase(tuple(head), head_epochs)
    shortcut_phase = client_training.Phase(tuple(shortcut), shortcut_epochs, weight_decay=ridge,
                                           after=project)
    first, second = ((shortcut_phase, head_phase) if config.order == "sw"
                     else (head_phase, shortcut_phase))
    second = dataclasses.replace(second, after=_chain(second.after, damp))
    built = [first, second]
    built.append(client_training.Phase(tuple(representation), representation_epochs))
    return tuple(built)


__all__ = ["AdaptPFLConfig", "ORDERS", "VARIANTS", "phases", "projection_kernels"]
