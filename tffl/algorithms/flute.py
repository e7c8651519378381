"""Deep FLUTE's client side (flute.md §4.2–4.4): its regularizers, class indicator and NC step,
as a `tffl.engine.client_hooks.ClientHook` on the engine's client work.

Client i's personal state is (its head variables..., u_i) with u_i ∈ {0,1}^m the classes it has
seen; in a round the hook or-s the round's labels into u_i, adds the penalties to the phases
(`_flute_phases`) and, after local training, takes the NC step on the head kernel.

Example:

>>> hook = FluteHook(FluteConfig(), kernel_index=2, num_classes=10, head_indices=(2, 3))
>>> hook.extra_types
(TensorType(np.float32, (10,)),)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import model_spec
from tffl.engine.client_hooks import ClientHook


VARIANTS = ("star", "plain")
FEATURE_REDUCTIONS = ("mean", "sum")


@dataclasses.dataclass(frozen=True)
class FluteConfig:
    """Deep FLUTE's regularizers and schedule (flute.md §4.2–4.4): the local objective is

        CE + λ1·R_batch ‖ψ(x)‖² + λ2·‖H‖²_F + λ3·NC(H; u_i)

    (the feature term only in phases that train the representation, as in the official code),
    and after local training the server step of Algorithm 2: one gradient step of size η_r on
    (1/|I|)·Σ_{i∈I} NC_i(H_i) over the round's heads. Its gradient in H_i is ∇NC_i(H_i)/|I|, so
    client i takes its own head's step, H_i ← H_i − (η_r/|I|)·∇NC_i(H_i), with |I| broadcast by
    the server (the official code runs SGD with lr 0.5 on that mean: 0.5/|I| per head).

    Attributes:
      feature_penalty: λ1 ≥ 0.
      feature_reduction: R over the batch, "mean" (default; the paper's Eq. (10): λ1 = 0.005 per
        example) or "sum" (the official code: the batch sum with λ1 = 0.0005, batches of 10).
      head_penalty: λ2 ≥ 0 (code: 0.0025).
      nc_penalty: λ3 ≥ 0 (code: 0.25).
      nc_step: η_r ≥ 0, the server step on the mean NC of the round's heads (code: 0.5).
      variant: "star" (FLUTE*, the official code's schedule: head-only epochs, then joint epochs)
        or "plain" (the paper's Algorithm 2: joint epochs only, H, b and B from the same point).
      final_head_epochs: E ≥ 0, the official code's final round (flute.md §4.4): after training,
        every client fine-tunes its head for E epochs on the FLUTE objective (representation
        fixed; the code: max(10, local_ep − local_rep_ep)) and is tested;
        `process.evaluate_final` runs it, the server state is not changed. 0: no final round.
    """

    feature_penalty: float = 0.005
    head_penalty: float = 0.0025
    nc_penalty: float = 0.25
    nc_step: float = 0.5
    feature_reduction: str = "mean"
    variant: str = "star"
    final_head_epochs: int = 0

    def __post_init__(self):
        for name in ("feature_penalty", "head_penalty", "nc_penalty", "nc_step"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"FLUTE {name}={value} must be a finite number >= 0")
        if (isinstance(self.final_head_epochs, bool) or int(self.final_head_epochs)
                != self.final_head_epochs or self.final_head_epochs < 0):
            raise ValueError(f"FLUTE final_head_epochs={self.final_head_epochs} must be an "
                             "integer >= 0")
        if self.feature_reduction not in FEATURE_REDUCTIONS:
            raise ValueError(f"FLUTE feature_reduction={self.feature_reduction!r} must be one of "
                             f"{', '.join(FEATURE_REDUCTIONS)}")
        if self.variant not in VARIANTS:
            raise ValueError(f"FLUTE variant={self.variant!r} must be one of "
                             f"{', '.join(VARIANTS)} (star: the code's head-then-joint epochs; "
                             "plain: the paper's Algorithm 2, joint epochs only)")


def neural_collapse(head_kernel: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
    """NC_i(H) = ‖ HᵀH/‖HᵀH‖_F − (1/√(m−1)) (u uᵀ) ⊙ (I_m − 11ᵀ/m) ‖_F  (flute.md §4.2).

    Args:
      head_kernel: H, shape (k, m) (a Keras Dense kernel: features × classes).
      classes: u, shape (m,), 1 for the classes the client holds, else 0.

    The client's sub-block of the m-class simplex-ETF Gram matrix is the target; heads of absent
    classes are pushed to 0. Norms use √(Σx² + 1e-12) so the gradient exists at 0.
    """
    h = tf.convert_to_tensor(head_kernel)
    m = h.shape[-1]
    dtype = h.dtype

    def frobenius(a):
        return tf.sqrt(tf.reduce_sum(tf.square(a)) + tf.constant(1e-12, dtype))

    gram = tf.matmul(h, h, transpose_a=True)
    gram = gram / frobenius(gram)
    u = tf.cast(classes, dtype)
    centering = tf.eye(m, dtype=dtype) - tf.ones((m, m), dtype) / m
    target = (u[:, tf.newaxis] * u[tf.newaxis, :]) * centering / np.sqrt(m - 1.0)
    return frobenius(gram - target)


def _features_model(model: tf.keras.Model, head_kernel: tf.Variable) -> tf.keras.Model:
    """`[input of the head layer, model output]`: the features ψ(x) beside the predictions."""
    for layer in model.layers:
        if any(w is head_kernel for w in layer.trainable_weights):
            return tf.keras.Model(model.inputs, [layer.input, model.output])
    raise ValueError(f"FLUTE: the head kernel {head_kernel.name} is not the kernel of a top-level "
                     "layer of the functional model, so its input features cannot be read")


def _class_indicator(previous: tf.Tensor, dataset, num_classes: int) -> tf.Tensor:
    """u_i: the classes seen in `dataset`'s labels, or-ed into the `previous` indicator."""

    def add(acc, batch):
        _, y = model_spec.split_batch(batch)
        labels = tf.cast(tf.reshape(y, [-1]), tf.int32)
        seen = tf.reduce_max(tf.one_hot(labels, num_classes, dtype=acc.dtype), axis=0)
        return tf.maximum(acc, seen)

    return dataset.reduce(tf.cast(previous, tf.float32), add)


def _flute_phases(phases, model, flute: FluteConfig, kernel_index: int, classes,
                  head_indices: Sequence[int]):
    """The phases with FLUTE's penalties: head phases get λ2‖H‖² + λ3·NC, the others also
    λ1·mean‖ψ(x)‖²."""
    kernel = model.trainable_variables[kernel_index]

    def head_terms():
        return (flute.head_penalty * tf.reduce_sum(tf.square(kernel))
                + flute.nc_penalty * neural_collapse(kernel, classes))

    def head_only(features):
        del features
        return head_terms()

    reduce = tf.reduce_mean if flute.feature_reduction == "mean" else tf.reduce_sum

    def with_features(features):
        flat = tf.reshape(features, [tf.shape(features)[0], -1])
        return (flute.feature_penalty * reduce(tf.reduce_sum(tf.square(flat), axis=1))
                + head_terms())

    out = []
    for phase in phases:
        head_phase = set(phase.train_indices) <= set(head_indices)
        out.append(dataclasses.replace(
            phase, penalty=head_only if head_phase else with_features))
    return out


class FluteHook(ClientHook):
    """FLUTE's client steps: class indicator in the personal state, penalties on the phases, and
    Algorithm 2's NC step on the head kernel H after local training: the gradient of
    (1/|I|)·Σ_i NC_i in H_i is ∇NC_i(H_i)/|I|, so each head's step needs only that head and |I|
    (the round input `num_clients`): it is taken on the client."""

    round_inputs = ("num_clients",)

    def __init__(self, flute: FluteConfig, kernel_index: int, num_classes: int,
                 head_indices: Sequence[int]):
        self.flute, self.kernel_index, self.num_classes = flute, kernel_index, num_classes
        self.head_indices = tuple(head_indices)
        self.extra_types = (tff.TensorType(np.float32, [num_classes]),)

    def prepare(self, model, extra, dataset, phases):
        classes = _class_indicator(extra[0], dataset, self.num_classes)
        kernel = model.trainable_variables[self.kernel_index]
        phases = _flute_phases(phases, model, self.flute, self.kernel_index, classes,
                               self.head_indices)
        return phases, _features_model(model, kernel), classes

    def finish(self, trained, classes, num_clients=None):
        trained = list(trained)
        if self.flute.nc_step > 0:
            if num_clients is None:
                raise ValueError("FLUTE's NC step needs |I|, the round's number of clients")
            k = self.kernel_index
            with tf.GradientTape() as tape:
                tape.watch(trained[k])
                nc = neural_collapse(trained[k], classes)
            step = self.flute.nc_step / tf.cast(num_clients, trained[k].dtype)
            trained[k] = trained[k] - step * tape.gradient(nc, trained[k])
        return trained, [classes]
