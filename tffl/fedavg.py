"""Plain FedAvg of a Keras model, as TFF's own weighted FedAvg learning process.

Round t (McMahan et al. 2017): the server broadcasts weights w_t; each sampled client i runs its
local SGD steps from w_t on its data and returns Δ_i = w_i − w_t with weight n_i (its number of
examples); the server applies w_{t+1} = w_t + η_s · Σ_i n_i Δ_i / Σ_i n_i (η_s = server learning rate,
plain SGD, so η_s = 1 is model averaging).

This is `tff.learning.algorithms.build_weighted_fed_avg` around `tff.learning.models.from_keras_model`,
so the result is a `tff.learning.templates.LearningProcess` that plugs into any `tff.learning`
program, and the aggregator is any `tff.aggregators` factory the caller passes.

Example:

>>> process = build_fedavg(lambda: make_mlp(), input_spec, client_learning_rate=0.1)
>>> state = process.initialize()
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff


def build_fedavg(
    keras_model_fn: Callable[[], tf.keras.Model],
    input_spec,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    loss_fn: Callable[[], tf.keras.losses.Loss] | None = None,
    metrics_fn: Callable[[], list[tf.keras.metrics.Metric]] | None = None,
    model_aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
) -> tff.learning.templates.LearningProcess:
    """FedAvg learning process for the (uncompiled) Keras model built by `keras_model_fn`.

    Args:
      keras_model_fn: builds a fresh, uncompiled Keras classifier returning logits.
      input_spec: the `(x, y)` element spec of a client's batched dataset.
      client_learning_rate: local SGD step size, > 0.
      server_learning_rate: server SGD step size on the averaged update, > 0.
      loss_fn: builds the loss (default: sparse categorical cross-entropy on logits).
      metrics_fn: builds the metrics (default: sparse categorical accuracy).
      model_aggregator: a `tff.aggregators` factory (default: TFF's weighted mean).
    """
    for name, value in (("client_learning_rate", client_learning_rate),
                        ("server_learning_rate", server_learning_rate)):
        if not value > 0:
            raise ValueError(f"{name}={value} must be > 0")
    loss_fn = loss_fn or (lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    metrics_fn = metrics_fn or (lambda: [tf.keras.metrics.SparseCategoricalAccuracy()])

    def model_fn() -> tff.learning.models.VariableModel:
        return tff.learning.models.from_keras_model(
            keras_model_fn(), loss=loss_fn(), input_spec=input_spec, metrics=metrics_fn()
        )

    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_learning_rate),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(server_learning_rate),
        model_aggregator=model_aggregator,
    )
