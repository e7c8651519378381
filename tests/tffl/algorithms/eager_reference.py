"""An eager-TensorFlow client written from the papers, independent of `tffl.engine.client_training`:
load the weights into a Keras model, then for each phase one pass of plain SGD over the
dataset's batches on that phase's variables (cross-entropy on logits, batch mean)."""

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
