"""`--suite=targets`'s plain baseline (experiments/benchmark/targets.py): the main setting's rounds
without TFF, on one eager Keras model, and which variables each round kind trains."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class PlainLoop:
    """Communication rounds without TFF on one eager model: set the global weights, then per
    client assign the broadcast trained variables, run SGD on them over the client's batches in a
    `tf.function`, read them back; then the example-weighted mean of the uploaded deltas in numpy
    (as `MeanFactory`)."""

    def __init__(self, model, trainable: Sequence[np.ndarray], non_trainable, learning_rate: float,
                 sets: dict[str, tuple[int, ...]]):
        import tensorflow as tf

        self.model = model
        for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
            variable.assign(value)  # once: frozen weights never change
        self.weights = [np.array(w) for w in trainable]
        self.sets = sets
        variables = model.trainable_variables
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self._runs = {}
        for kind, indices in sets.items():
            trained = [variables[k] for k in indices]

            def run(values, dataset, trained=trained):
                for variable, value in zip(trained, values):
                    variable.assign(value)
                loss_sum, count = tf.constant(0.0), tf.constant(0.0)
                for x, y in iter(dataset):
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, model(x, training=True))
                    grads = tape.gradient(loss, trained,
                                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    for variable, grad in zip(trained, grads):
                        variable.assign_sub(learning_rate * grad)
                    n = tf.cast(tf.shape(y)[0], tf.float32)
                    loss_sum += loss * n
                    count += n
                return [v.read_value() for v in trained], loss_sum, count

            self._runs[kind] = tf.function(run)

    def round(self, kind: str, datasets) -> float:
        """One communication round of `kind`; returns the mean train loss."""
        indices = self.sets[kind]
        for variable, value in zip(self.model.trainable_variables, self.weights):
            variable.assign(value)  # the variables this round does not train: the global ones
        start = [self.weights[k] for k in indices]
        sums = [np.zeros_like(w) for w in start]
        total = loss_total = 0.0
        for dataset in datasets:
            values, loss_sum, count = self._runs[kind](start, dataset)
            n = float(count)
            for s, v, w in zip(sums, values, start):
                s += n * (v.numpy() - w)
            total += n
            loss_total += float(loss_sum)
        for k, s in zip(indices, sums):
            self.weights[k] = self.weights[k] + (s / total).astype(self.weights[k].dtype)
        return loss_total / total


def trained_sets(process, algorithm: str) -> dict[str, tuple[int, ...]]:
    """Positions in `spec.trainable` each round kind trains and uploads (the builders' default
    extra role, the head, rides along)."""
    from tffl.engine import roles

    spec = process.spec
    if algorithm == "rolora":
        return {"b_round": tuple(spec.indices([roles.LORA_B, roles.HEAD])),
                "a_round": tuple(spec.indices([roles.LORA_A, roles.HEAD]))}
    return {"ab_round": tuple(spec.indices([roles.LORA_A, roles.LORA_B, roles.HEAD]))}
