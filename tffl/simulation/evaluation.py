"""Centralized evaluation of a process's global model on a held-out dataset.

For a classifier with logits z(x) and labels y, over the N examples of `dataset`:
  loss = (1/N) Σ CE(softmax(z(x_n)), y_n),   accuracy = (1/N) Σ [argmax z(x_n) = y_n].

Example:

>>> with runtime.local_runtime():
...     weights = process.model_weights(process.initialize())  # whole model, frozen included
>>> trainable = list(weights.trainable)              # [A, B, head kernel, head bias]
>>> trainable[2], trainable[3] = np.zeros((8, 3), np.float32), np.zeros(3, np.float32)
>>> weights = tff.learning.models.ModelWeights(trainable, weights.non_trainable)  # logits z = 0
>>> evaluate = make_keras_evaluator(model_fn, client_datasets[0])
>>> round(evaluate(weights)["loss"], 4)               # CE of the uniform softmax: ln 3
1.0986
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff


def make_keras_evaluator(
    keras_model_fn: Callable[[], tf.keras.Model],
    dataset: tf.data.Dataset | Callable[[], tf.data.Dataset],
    with_count: bool = False,
) -> Callable[[tff.learning.models.ModelWeights], dict[str, float]]:
    """Returns `weights -> {"loss", "accuracy"}` evaluating one reused Keras model on `dataset`
    (or on the dataset `dataset()` returns, made on the first evaluation); `with_count` adds
    `num_examples`, the examples evaluated (so that evaluations of parts can be pooled).

    `dataset` yields batched `(x, y)` with integer labels; the model returns logits. The model is
    built on the first call, not here: Keras invalidates models built eagerly before TFF traces a
    computation (TFF builds models inside a `tf.compat.v1` graph), so it must come after the
    process is built.
    """
    cache = {}

    def build():
        model = keras_model_fn()
        data = dataset() if callable(dataset) else dataset
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

        @tf.function
        def totals():
            loss_sum = tf.constant(0.0)
            correct = tf.constant(0.0)
            count = tf.constant(0.0)
            for x, y in iter(data):
                logits = model(x, training=False)
                y = tf.cast(tf.reshape(y, [-1]), tf.int64)
                loss_sum += loss_fn(y, logits)
                correct += tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), y), tf.float32))
                count += tf.cast(tf.shape(y)[0], tf.float32)
            return loss_sum / count, correct / count, count

        return model, totals

    def evaluate(weights: tff.learning.models.ModelWeights) -> dict[str, float]:
        if "model" not in cache:
            cache["model"], cache["totals"] = build()
        weights.assign_weights_to(cache["model"])
        loss, accuracy, count = cache["totals"]()
        out = {"loss": float(loss), "accuracy": float(accuracy)}
        if with_count:
            out["num_examples"] = float(count)
        return out

    return evaluate
