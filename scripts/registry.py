"""Names on the command line -> tasks, algorithms and samplers (the wiring of scripts/train.py).

Dependencies point one way: scripts -> tasks -> models, scripts -> tffl. This module is where a
flag value such as `--algorithm=fedavg --task=digits` becomes objects.
"""

from __future__ import annotations

import dataclasses
import pathlib
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
    train_data, batch_size: int, local_steps: int, seed: int
) -> Callable[[str, int], tf.data.Dataset]:
    """Client `cid`'s data for round `t`: shuffled with a seed of `(seed, t, cid)`, repeated,
    batched, and cut to `local_steps` batches (so each client takes exactly that many steps)."""
    index = {cid: i for i, cid in enumerate(train_data.client_ids)}

    def dataset(cid: str, round_num: int) -> tf.data.Dataset:
        shuffle_seed = int(np.random.SeedSequence((seed, round_num, index[cid])).generate_state(1)[0])
        return (
            train_data.create_tf_dataset_for_client(cid)
            .shuffle(_SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=False)
            .repeat()
            .batch(batch_size)
            .take(local_steps)
        )

    return dataset


_SHUFFLE_BUFFER = 10_000  # larger than any client's data here: a full shuffle


def _run_task(task, hidden: int, batch_size: int, local_steps: int, seed: int) -> RunTask:
    """Wraps a `tasks.task.Task` of flat features with an MLP for the round loop."""
    from models import paper_models

    input_dim = int(task.element_spec[0].shape[-1])

    def keras_model_fn() -> tf.keras.Model:
        return paper_models.build_mlp(
            input_dim=input_dim, hidden=(hidden,), num_classes=task.num_classes, seed=seed
        )

    input_spec = tf.nest.map_structure(
        lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype), task.element_spec
    )
    sizes = task.info.get("train_sizes") if isinstance(task.info, dict) else None
    n_train = sum(sizes.values()) if isinstance(sizes, dict) else "?"
    return RunTask(
        description=f"{task.name} ({n_train} train examples, MLP {input_dim}-{hidden}-"
        f"{task.num_classes})",
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=_client_dataset_fn(task.train_data, batch_size, local_steps, seed),
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        evaluate=evaluation.make_keras_evaluator(keras_model_fn, task.global_test_data.batch(256)),
    )


def _scheme_kwargs(partition: str, classes_per_client: int, dirichlet_alpha: float) -> dict:
    if partition == "shards":
        return {"classes_per_client": classes_per_client}
    if partition == "dirichlet":
        return {"alpha": dirichlet_alpha}
    return {}


def _digits_task(num_clients, batch_size, local_steps, seed, partition, data_dir, **kw) -> RunTask:
    from tasks import task as task_lib

    del data_dir
    task = task_lib.digits_task(num_clients, scheme=partition, seed=seed,
                                **_scheme_kwargs(partition, **kw))
    return _run_task(task, hidden=32, batch_size=batch_size, local_steps=local_steps, seed=seed)


def _mnist_task(num_clients, batch_size, local_steps, seed, partition, data_dir, **kw) -> RunTask:
    from tasks import task as task_lib

    path = pathlib.Path(data_dir) / "mnist" / "mnist_5k.csv.gz"
    task = task_lib.mnist_csv_task(path, num_clients, scheme=partition, seed=seed,
                                   **_scheme_kwargs(partition, **kw))
    return _run_task(task, hidden=200, batch_size=batch_size, local_steps=local_steps, seed=seed)


_TASK_BUILDERS = {"digits": _digits_task, "mnist": _mnist_task}
TASKS = tuple(_TASK_BUILDERS)
PARTITIONS = ("iid", "shards", "dirichlet")


def build_task(
    name: str,
    num_clients: int,
    batch_size: int,
    local_steps: int,
    seed: int,
    partition: str = "iid",
    classes_per_client: int = 2,
    dirichlet_alpha: float = 0.5,
    data_dir: str | pathlib.Path = "../shared/data",
) -> RunTask:
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(_TASK_BUILDERS)}")
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    return _TASK_BUILDERS[name](
        num_clients, batch_size, local_steps, seed, partition, data_dir,
        classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha,
    )


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
