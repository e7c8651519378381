"""Personalized federated evaluation: each client's model (federated weights + frozen base +
its personal state), optionally fine-tuned on its training data, tested on its test data.

Over clients i with n_i test examples: loss = Σ_i loss_sum_i / Σ_i n_i, accuracy =
Σ_i correct_i / Σ_i n_i, and `mean_client_accuracy` = (1/N) Σ_i correct_i / n_i.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training, model_spec
from tffl.engine.client_hooks import ClientConfig, ClientHook
from tffl.engine.federated_model import FederatedModel, personal_spec


def _build_evaluate_loop(model, loss_fn):
    """`tf.function (weights, dataset) -> (loss_sum, num_correct, num_examples)` of `model` with
    `weights` (a whole-model `ModelWeights`) assigned."""

    @tf.function
    def evaluate(weights, dataset):
        for variable, value in zip(model.trainable_variables, weights.trainable, strict=True):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, weights.non_trainable,
                                   strict=True):
            variable.assign(value)
        loss_sum = tf.constant(0.0, tf.float32)
        num_correct = tf.constant(0.0, tf.float32)
        num_examples = tf.constant(0.0, tf.float32)
        for batch in iter(dataset):
            x, y = model_spec.split_batch(batch)
            pred = model(x, training=False)
            n = tf.cast(tf.shape(y)[0], tf.float32)
            loss_sum += tf.cast(loss_fn(y, pred), tf.float32) * n
            labels = tf.cast(tf.reshape(y, [-1]), tf.int64)
            num_correct += tf.reduce_sum(
                tf.cast(tf.equal(tf.argmax(pred, -1), labels), tf.float32))
            num_examples += n
        return loss_sum, num_correct, num_examples

    return evaluate


@tff.tensorflow.computation(np.float32, np.float32)
def _divide(a, b):
    return tf.math.divide_no_nan(a, b)


def _client_evaluate(model: FederatedModel, client: ClientConfig, finetune, hook,
                     finetune_objective: bool, personal) -> tff.Computation:
    """One client's `<weights, [personal,] train, test> -> sums` TF computation (one struct
    argument; the personal state only when `personal` declares one)."""
    layout = model.layout

    def client_eval(weights, personal_values, train_ds, test_ds):
        with client_training.placed(model.client_device):
            keras_model = model_spec.build_model(model.keras_model_fn, model.input_spec,
                                                 zero_init=True)
            own = personal_values[: len(layout.personal)]
            full = layout.assemble(weights, model.frozen.restore(),
                                   own if layout.personal else None)
            if finetune:
                phases, features_model = finetune, None
                if finetune_objective and hook is not None:
                    extra = personal_values[len(layout.personal):]
                    phases, features_model, _ = hook.prepare(keras_model, extra, train_ds,
                                                             finetune)
                loop = client_training.build_phased_loop(
                    keras_model, model.loss_fn(), client.optimizer, phases, features_model,
                    device=model.client_device, weight_decay=client.weight_decay)
                full = tff.learning.models.ModelWeights(
                    trainable=loop(full, train_ds)["trainable"],
                    non_trainable=list(full.non_trainable))
            loss_sum, num_correct, num_examples = _build_evaluate_loop(
                keras_model, model.loss_fn())(full, test_ds)
        return collections.OrderedDict(
            loss_sum=loss_sum, num_correct=num_correct, num_examples=num_examples,
            accuracy=tf.math.divide_no_nan(num_correct, num_examples))

    members = [layout.global_type()] + ([personal.type] if personal else []) + [
        model.data_type(), model.data_type()]

    @tff.tensorflow.computation(tff.StructType(members))
    def client_evaluate(args):
        args = list(args)
        personal_values = list(args.pop(1)) if personal else []
        return client_eval(args[0], personal_values, args[1], args[2])

    return client_evaluate


def _summarize(out):
    num_examples = tff.federated_sum(out.num_examples)
    return tff.federated_zip(collections.OrderedDict(
        loss=tff.federated_map(_divide, (tff.federated_sum(out.loss_sum), num_examples)),
        accuracy=tff.federated_map(_divide, (tff.federated_sum(out.num_correct), num_examples)),
        mean_client_accuracy=tff.federated_mean(out.accuracy),
        num_examples=num_examples))


def build_evaluation(model: FederatedModel, client: ClientConfig,
                     finetune: Sequence[client_training.Phase] = (),
                     hook: ClientHook | None = None,
                     finetune_objective: bool = False) -> tff.Computation:
    """Personalized federated evaluation `(w@S, [personal@C,] train@C, test@C) -> metrics@S`.

    Client i assembles its model from the federated weights w, the frozen weights and its
    personal state (if the model has personal variables), optionally fine-tunes it on its
    training data with the `finetune` phases (`client`'s optimizer and weight decay; with
    `finetune_objective`, the phases as the `hook` prepares them, e.g. FLUTE's penalties), and
    tests on its test data. Metrics: example-weighted `loss` and `accuracy` over all clients' test
    examples, `mean_client_accuracy` (the unweighted mean over clients) and `num_examples`.
    """
    personal = personal_spec(model, hook)
    client_evaluate = _client_evaluate(model, client, list(finetune), hook, finetune_objective,
                                       personal)
    at_server = tff.FederatedType(model.layout.global_type(), tff.SERVER)
    at_clients = tff.FederatedType(model.data_type(), tff.CLIENTS)
    if personal:
        @tff.federated_computation(at_server, tff.FederatedType(personal.type, tff.CLIENTS),
                                   at_clients, at_clients)
        def evaluate(weights, personal_states, train, test):
            sent = tff.federated_broadcast(weights)
            return _summarize(tff.federated_map(client_evaluate,
                                                (sent, personal_states, train, test)))
    else:
        @tff.federated_computation(at_server, at_clients, at_clients)
        def evaluate(weights, train, test):
            sent = tff.federated_broadcast(weights)
            return _summarize(tff.federated_map(client_evaluate, (sent, train, test)))
    return evaluate
