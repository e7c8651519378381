"""Head-only phases over cached features: the layers below the head run once per batch.

A phase of `tffl.engine.client_training.build_phased_loop` that trains only variables of the model's
output layer h (a personal head: FedRep's and FLUTE's head epochs, FedAvg-FT's fine-tuning) leaves
everything below it fixed. Writing the model as f(x) = h(ψ(x)), with ψ the *body* (every layer
below h), its E epochs over the batches (x_k, y_k), k = 1..K, are

    θ_h ← θ_h − η·∇_{θ_h} ℓ(y_k, h(ψ(x_k); θ_h))      E passes over k = 1..K

and ψ(x_k) is the same in every pass. So the loop computes z_k = ψ(x_k) once per batch (one
pass over the dataset, kept in a `tf.TensorArray` of K tensors of shape (n_k, d)) and runs the
E passes of head steps on (z_k, y_k). On MiniLM layers 3–5 with a 384 → 2 head, a FedRep round
with 5 head epochs then runs the transformer layers forward 1 + 1 times per batch (head pass,
representation phase), not 5 + 1.

This is exact only when ψ is deterministic: `head_split` refuses a body with a dropout or noise
layer of positive rate or a trainable batch normalization (whose training-mode output and
moving statistics change with every call; a frozen one is a fixed affine map); such a model
runs its epochs through the whole model, as does a phase with `cache_features=False`. The
passes replay the first pass's batches, which is the loop's definition; a dataset that
reshuffles on every iteration is read once.

Example (a 3 → 2 body and a 2 → 1 head; a phase on the head is cached, one on the body is not):

>>> inputs = tf.keras.Input((3,))
>>> model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Dense(2)(inputs)))
>>> body, head = head_split(model, [model.trainable_variables[2]])
>>> body.output_shape, head.name == model.layers[-1].name
((None, 2), True)
>>> head_split(model, [model.trainable_variables[0]]) is None
True
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import tensorflow as tf

# Layers whose training-mode output is random or whose call updates state; `rate`/`stddev` 0
# makes the noise ones deterministic, and `trainable=False` the batch normalizations (Keras then
# runs them in inference mode, on the fixed moving statistics, whatever `training` says).
_NOISE = (tf.keras.layers.Dropout, tf.keras.layers.GaussianNoise,
          tf.keras.layers.GaussianDropout, tf.keras.layers.AlphaDropout)
_STATEFUL = (tf.keras.layers.BatchNormalization,
             tf.keras.layers.experimental.SyncBatchNormalization)


def _positive_rate(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


def stochastic_layers(body: tf.Module) -> list[str]:
    """Names of `body` and the layers in it (at any depth) whose training-mode call is random
    or updates state: dropout/noise of positive rate, a trainable batch normalization (a frozen
    one normalizes with its fixed moving statistics), and any layer with a positive `dropout`
    rate attribute (e.g. a KerasNLP encoder layer, or a layer that applies `tf.nn.dropout`
    itself)."""
    found = []
    for layer in (body, *body.submodules):
        if isinstance(layer, _STATEFUL):
            if layer.trainable:
                found.append(layer.name)
        elif isinstance(layer, _NOISE):
            amount = getattr(layer, "rate", None)
            amount = getattr(layer, "stddev", None) if amount is None else amount
            if amount is None or float(amount) > 0:
                found.append(layer.name)
        elif _positive_rate(getattr(layer, "dropout", None)):
            found.append(layer.name)
    return found


def head_split(model: tf.keras.Model, trained: Sequence[tf.Variable]
               ) -> tuple[tf.keras.Model, tf.keras.layers.Layer] | None:
    """`(body ψ, head layer h)` with model(x) = h(ψ(x)) when every variable in `trained`
    belongs to the functional model's output layer h, ψ is deterministic
    (`stochastic_layers(ψ)` is empty) and h is called once, on one input; else None."""
    if not trained or not getattr(model, "_is_graph_network", False) or len(model.outputs) != 1:
        return None
    head = model.layers[-1]
    try:
        head_input, head_output = head.input, head.output
    except AttributeError:  # called more than once: no single input
        return None
    if head_output is not model.outputs[0] or isinstance(head_input, (list, tuple, dict)):
        return None
    owned = {id(v) for v in head.trainable_weights}
    if any(id(v) not in owned for v in trained):
        return None
    if model.inputs and any(head_input is t for t in model.inputs):
        return None  # nothing below the head to skip
    body = tf.keras.Model(model.input, head_input)  # the input structure (e.g. a dict) kept
    if stochastic_layers(body):
        return None
    return body, head



def cache(body: tf.keras.Model, batches: tf.data.Dataset) -> tuple[list[tf.TensorArray], tf.Tensor]:
    """`(arrays, K)`: ψ(x_k) (`body(x, training=True)`) and the leaves of y_k of every `(x, y)`
    batch of `batches`, in one pass (a `tf.while_loop` when traced); batch sizes may differ.
    `read(arrays, y_structure, k)` gives batch k back."""
    _, y_spec = batches.element_spec
    z_spec = tf.TensorSpec([None, *body.output_shape[1:]], body.outputs[0].dtype)
    arrays = [tf.TensorArray(s.dtype, size=0, dynamic_size=True, infer_shape=False,
                             element_shape=s.shape)
              for s in [z_spec, *tf.nest.flatten(y_spec)]]
    size = tf.constant(0)
    for x, y in iter(batches):
        values = [body(x, training=True), *tf.nest.flatten(y)]
        arrays = [a.write(size, v) for a, v in zip(arrays, values)]
        size += 1
    return arrays, size


def read(arrays: list[tf.TensorArray], y_structure, k: tf.Tensor):
    """(ψ(x_k), y_k) of the k-th cached batch, y_k packed as `y_structure`."""
    z, *y = [a.read(k) for a in arrays]
    return z, tf.nest.pack_sequence_as(y_structure, y)
