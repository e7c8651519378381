"""An eager-TensorFlow client written from the papers, independent of `tffl.engine.client_training`:
load the weights into a Keras model, then for each phase one pass of plain SGD over the
dataset's batches on that phase's variables (cross-entropy on logits, batch mean); and the
first two rounds of a RoLoRA process on a TFF worker, for tests to compare with it."""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf


def sgd_phases(model, trainable, non_trainable, phases, dataset, lr) -> list[np.ndarray]:
    """The model's trainable values after the phases (`phases`: lists of positions in
    `model.trainable_variables`), starting from `trainable` / `non_trainable`."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for var, value in zip(model.trainable_variables, trainable):
        var.assign(value)
    for var, value in zip(model.non_trainable_variables, non_trainable):
        var.assign(value)
    for indices in phases:
        variables = [model.trainable_variables[k] for k in indices]
        for x, y in dataset:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            for var, grad in zip(variables, tape.gradient(loss, variables)):
                var.assign_sub(lr * grad)
    return [v.numpy() for v in model.trainable_variables]


def rolora_two_rounds(process, datasets, randomized: Sequence[int], stddev: float) -> tuple:
    """RoLoRA's first two communication rounds (B, then A) on a TFF worker, from the process's
    initial state with the trainable variables at `randomized` drawn N(0, stddev²) (seed 0), so
    that B ≠ 0 and the A round moves A: the model weights (start, after B, after A)."""
    from tffl import runtime

    with runtime.local_runtime():
        state = process.initialize()
        weights = process.model_weights(state)
        rng = np.random.default_rng(0)
        trainable = [rng.normal(0, stddev, w.shape).astype(np.float32) if k in randomized else w
                     for k, w in enumerate(weights.trainable)]
        state = process.with_model_weights(state, type(weights)(trainable,
                                                                 list(weights.non_trainable)))
        start = process.model_weights(state)
        after_b = process.next_round(state, datasets).state
        mid = process.model_weights(after_b)
        end = process.model_weights(process.next_round(after_b, datasets).state)
    return start, mid, end
