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

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import frozen


def make_keras_evaluator(
    keras_model_fn: Callable[[], tf.keras.Model],
    dataset: tf.data.Dataset | Callable[[], tf.data.Dataset],
    with_count: bool = False,
    graph_per_batch: bool = False,
    on_predictions: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> Callable[[tff.learning.models.ModelWeights], dict[str, float]]:
    """Returns `weights -> {"loss", "accuracy"}` evaluating one reused Keras model on `dataset`
    (or on the dataset `dataset()` returns, made on the first evaluation); `with_count` adds
    `num_examples`, the examples evaluated (so that evaluations of parts can be pooled).

    The loop over batches runs inside one `tf.function`; with `graph_per_batch` it runs in Python
    over one graph for every batch (traced once, for the dataset's element spec), for models
    whose batches vary in shape and whose graph the dataset loop would otherwise run eagerly (a
    decoder LM on bucketed prompts).
    `on_predictions(predicted, labels)`, if given, receives every evaluation's per-example
    argmax z(x_n) and y_n (int64, in the dataset's order; one graph per batch then too).

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

        def batch_totals(x, y):
            logits = model(x, training=False)
            y = tf.cast(tf.reshape(y, [-1]), tf.int64)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), y), tf.float32))
            return tf.stack([loss_fn(y, logits), correct, tf.cast(tf.shape(y)[0], tf.float32)])

        if on_predictions is not None:
            @tf.function(reduce_retracing=True)
            def one_batch(x, y):
                logits = model(x, training=False)
                return (batch_totals(x, y), tf.argmax(logits, -1),
                        tf.cast(tf.reshape(y, [-1]), tf.int64))

            def totals():
                sums, predicted, labels = np.zeros(3), [], []
                for x, y in data:
                    batch, p, t = one_batch(x, y)
                    sums += batch.numpy().astype("float64")
                    predicted.append(p.numpy())
                    labels.append(t.numpy())
                on_predictions(np.concatenate(predicted), np.concatenate(labels))
                return sums
        elif graph_per_batch:
            # Traced once, for the dataset's element spec: a batch's shape first, then relaxed
            # ones (another width, a smaller last batch) would trace again, seconds each for
            # a decoder.
            one_batch = tf.function(batch_totals, input_signature=list(data.element_spec))

            def totals():
                return sum((one_batch(x, y).numpy().astype("float64") for x, y in data),
                           np.zeros(3))
        else:
            @tf.function
            def totals():
                total = tf.zeros([3])
                for x, y in iter(data):
                    total += batch_totals(x, y)
                return total

        return model, totals

    def evaluate(weights: tff.learning.models.ModelWeights) -> dict[str, float]:
        if "model" not in cache:
            cache["model"], cache["totals"] = build()
        frozen.assign_weights(weights, cache["model"])   # a base by reference: read once
        loss_sum, correct, count = (float(v) for v in cache["totals"]())
        if count == 0:
            raise ValueError("the evaluation dataset has no examples; check the evaluated "
                             "split (e.g. --data_dir's dev or test file)")
        out = {"loss": loss_sum / count, "accuracy": correct / count}
        if with_count:
            out["num_examples"] = float(count)
        return out

    return evaluate
