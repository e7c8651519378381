"""Names on the command line -> tasks, algorithms and samplers (the wiring of scripts/train.py).

Dependencies point one way: scripts -> tasks -> models, scripts -> tffl. This module is where a
flag value such as `--algorithm=fedavg --task=digits` becomes objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tffl import evaluation
from tffl import fedavg
from tffl import participation


@dataclasses.dataclass
class RunTask:
    """What the round loop needs from a task: clients, their data, a model and an evaluator."""

    description: str
    client_ids: list[str]
    client_dataset_fn: Callable[[str, int], tf.data.Dataset]
    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    evaluate: Callable[[Any], dict[str, float]]


def _client_dataset_fn(
    client_arrays: dict[str, tuple[np.ndarray, np.ndarray]],
    batch_size: int,
    local_steps: int,
    seed: int,
) -> Callable[[str, int], tf.data.Dataset]:
    """Client `cid`'s data for round `t`: shuffled with a seed of `(seed, t, cid)`, repeated,
    batched, and cut to `local_steps` batches (so each client takes exactly that many steps)."""
    index = {cid: i for i, cid in enumerate(client_arrays)}

    def dataset(cid: str, round_num: int) -> tf.data.Dataset:
        x, y = client_arrays[cid]
        shuffle_seed = int(np.random.SeedSequence((seed, round_num, index[cid])).generate_state(1)[0])
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), seed=shuffle_seed, reshuffle_each_iteration=False)
            .repeat()
            .batch(batch_size)
            .take(local_steps)
        )

    return dataset


def _mlp(input_dim: int, hidden: int, num_classes: int, seed: int) -> tf.keras.Model:
    """x -> ReLU(x W1 + b1) W2 + b2 (logits), with seeded Glorot initialization."""
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input((input_dim,)),
            tf.keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(seed)),
            tf.keras.layers.Dense(num_classes, kernel_initializer=init(seed + 1)),
        ]
    )


def _digits_task(num_clients: int, batch_size: int, local_steps: int, seed: int) -> RunTask:
    from tasks import images
    from tasks import partition

    x, y = images.load_digits()
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test_idx, train_idx = order[:n_test], order[n_test:]
    x_train, y_train = x[train_idx], y[train_idx]
    parts = partition.iid(y_train, num_clients=num_clients, seed=seed)
    client_arrays = {cid: (x_train[idx], y_train[idx]) for cid, idx in parts.items()}

    def keras_model_fn() -> tf.keras.Model:
        return _mlp(input_dim=64, hidden=32, num_classes=10, seed=seed)

    test = tf.data.Dataset.from_tensor_slices((x[test_idx], y[test_idx])).batch(256)
    input_spec = (tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32))
    return RunTask(
        description=f"digits (sklearn 8x8, {len(train_idx)} train / {n_test} test)",
        client_ids=list(client_arrays),
        client_dataset_fn=_client_dataset_fn(client_arrays, batch_size, local_steps, seed),
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        evaluate=evaluation.make_keras_evaluator(keras_model_fn, test),
    )


_TASK_BUILDERS = {"digits": _digits_task}


def build_task(name: str, num_clients: int, batch_size: int, local_steps: int, seed: int) -> RunTask:
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(_TASK_BUILDERS)}")
    return _TASK_BUILDERS[name](num_clients, batch_size, local_steps, seed)


def build_algorithm(
    name: str, task: RunTask, client_learning_rate: float, server_learning_rate: float
):
    if name == "fedavg":
        return fedavg.build_fedavg(
            task.keras_model_fn,
            task.input_spec,
            client_learning_rate=client_learning_rate,
            server_learning_rate=server_learning_rate,
        )
    raise ValueError(f"unknown algorithm {name!r}; choose one of fedavg")


def build_sampler(task: RunTask, clients_per_round: int, seed: int):
    return participation.UniformSampler(task.client_ids, clients_per_round, seed)
