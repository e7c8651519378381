"""`RunTask`, what the round loop needs from a task, and the dataset helpers its builders share.

`tasks.registry` builds `RunTask`s by name: flat-feature (image) tasks there, text tasks in
`tasks.text_run_task`, instruction tasks in `tasks.instruct_run_task`; they cut their clients'
data with the helpers here (one shuffle buffer for every task: `tasks.batching.SHUFFLE_BUFFER`).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tasks import batching


@dataclasses.dataclass
class RunTask:
    """What the round loop needs from a task: clients, their data, a model and an evaluator."""

    description: str
    client_ids: list[str]
    client_dataset_fn: Callable[[str, int], tf.data.Dataset]
    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    evaluate: Callable[[Any], dict[str, float]]
    # Per-client evaluation data: `() -> (client ids, train datasets, test datasets)`, batched;
    # the clients with a non-empty test split, each train dataset one pass over its data.
    client_eval_data: Callable[[], tuple[list[str], list, list]] | None = None
    # The same for a held-out split beside the test split (SST-2's labeled test split with
    # --eval_test), cut per client like the test split: personalized runs report it too.
    client_heldout_data: Callable[[], tuple[list[str], list, list]] | None = None
    # `() -> list of arrays or None`: pretrained frozen weights to start from (text tasks).
    pretrained_non_trainable: Callable[[], Any] | None = None
    # Examples in the pooled test set `evaluate` reads (None: unknown). When the clients' test
    # sets add up to it they partition it, and per-client evaluations pool to `evaluate`'s.
    global_test_size: int | None = None
    # The name of the split `evaluate` reads ("dev", "validation", "test"), for reports.
    eval_split: str = "test"
    # The classes, and their names in index order when the data named them (the user's labels).
    num_classes: int | None = None
    label_names: tuple[str, ...] | None = None
    # The model's backbone is a random test backbone (`tiny`, `gpt2_tiny`): its results say
    # nothing about the algorithms.
    random_backbone: bool = False
    # The text tasks' `tasks.prefix_cache.PrefixCache` (None: no cached prefix).
    prefix_cache: Any = None
    # Every evaluated example's prediction (`tffl.simulation.predictions.PredictionLog`), kept
    # by the text classification tasks' evaluators; None where a task keeps none.
    prediction_log: Any = None
    # The instruction tasks' `models.decoders.Decoder` (its tokenizer and special tokens, which
    # generation from the trained model needs); None for the classifiers.
    decoder: Any = None


def ordered(*element):
    """The dataset element with every dict an `OrderedDict` of sorted keys (TFF serializes named
    elements only in that form; text features are dicts)."""

    def convert(value):
        if isinstance(value, dict):
            return collections.OrderedDict((k, convert(value[k])) for k in sorted(value))
        if isinstance(value, (tuple, list)):
            return type(value)(convert(v) for v in value)
        return value

    return convert(element[0] if len(element) == 1 else tuple(element))


def client_dataset_fn(
    train_data, batch_size: int, local_steps: int, seed: int
) -> Callable[[str, int], tf.data.Dataset]:
    """Client `cid`'s data for round `t`: shuffled with a seed of `(seed, t, cid)`, repeated,
    batched, and cut to `local_steps` batches (so each client takes exactly that many steps)."""
    index = {cid: i for i, cid in enumerate(train_data.client_ids)}

    def dataset(cid: str, round_num: int) -> tf.data.Dataset:
        shuffle_seed = int(np.random.SeedSequence((seed, round_num, index[cid])).generate_state(1)[0])
        round_data = (
            train_data.create_tf_dataset_for_client(cid)
            .map(ordered)
            .shuffle(batching.SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=False)
            .repeat()
            .batch(batch_size)
            .take(local_steps)
        )
        return materialized(round_data)

    return dataset


def materialized(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The same batches, held as tensors of this round's examples only.

    A client's dataset is built from its whole data, which `process.next` would serialize into
    the computation's arguments every round (tens of MB for a text client); materializing the
    round's K batches first sends K·B examples instead. The batches are identical.
    """
    batches = list(dataset.as_numpy_iterator())
    if not batches:
        return dataset
    stacked = tf.nest.map_structure(lambda *parts: np.stack(parts), *batches)
    return tf.data.Dataset.from_tensor_slices(stacked)


def client_eval_data_fn(task, batch_size: int):
    """`() -> (ids, train, test)` for personalized evaluation, built once on first call."""
    cache = {}

    def build():
        if "data" not in cache:
            with_test = set(task.test_data.client_ids)
            ids = [cid for cid in task.train_data.client_ids if cid in with_test]
            train = [task.train_data.create_tf_dataset_for_client(cid).map(ordered)
                     .batch(batch_size) for cid in ids]
            test = [task.test_data.create_tf_dataset_for_client(cid).map(ordered).batch(256)
                    for cid in ids]
            cache["data"] = (ids, train, test)
        return cache["data"]

    return build


def starting_non_trainable(keras_model_fn: Callable[[], tf.keras.Model], input_spec,
                           pretrained: Callable[[], list] | None = None, what: str = "",
                           frozen_dir: str | None = None) -> Callable[[], list]:
    """`() -> non_trainable`: a model's starting frozen weights, computed once on first call:
    `pretrained()` (e.g. a checkpoint's backbone with the same LoRA applied) when given, with the
    progress line "loading the pretrained weights of `what`"; else `keras_model_fn`'s own random
    draw (`tffl.engine.frozen.initial_values`). Nothing is drawn when `pretrained` is given:
    every frozen value is the checkpoint's, and the trainable ones are the process builder's own
    draw (drawing the whole MiniLM classifier first took 6.9 s of a run's start here).

    Between calls the values are not held in memory (1.07 GB for Gemma 3 270M, through a whole
    run): the first call writes them to a fingerprinted `tffl.engine.frozen.FrozenWeights` file
    under `frozen_dir` (None: `tffl.engine.frozen.default_directory()`; the tasks pass the run's
    `ModelConfig.frozen_dir`, where its LoRA process writes the base) and later calls read them
    back from it (they stay in memory when that folder cannot be written, and are computed again
    if the file is gone)."""
    computed = {}

    def values():
        from tffl.engine import frozen as frozen_lib

        if "file" in computed:
            try:
                computed["file"].check_readable()
                return computed["file"].load()
            except FileNotFoundError:   # the cache was cleaned meanwhile: computed again
                del computed["file"]
        if "values" in computed:
            return computed["values"]
        if pretrained is not None:
            from tffl.simulation.metrics_log import announce

            announce(f"loading the pretrained weights of {what}")
            result = pretrained()
            # The checkpoint's Keras model is garbage in reference cycles (Keras layers and
            # their variables point at each other) that Python's collector may not reach for a
            # long time; for Gemma 3 270M it held 2.2 GB through the run.
            gc.collect()
        else:
            result = frozen_lib.initial_values(keras_model_fn, input_spec)[1]
        result = [np.asarray(v) for v in result]
        try:
            computed["file"] = frozen_lib.FrozenWeights.write(result, frozen_dir)
        except OSError:   # an unwritable cache folder: held in memory instead
            computed["values"] = result
        return result

    return values


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, in the plural unless count is 1, as run descriptions print them.

    >>> counted(1, "client"), counted(3, "client")
    ('1 client', '3 clients')
    """
    return f"{count} {noun}" + ("" if count == 1 else "s")


def dataset_size(dataset: tf.data.Dataset) -> int | None:
    """The number of elements of `dataset`, or None when TensorFlow does not know it."""
    size = int(dataset.cardinality())
    return size if size >= 0 else None


def train_size(task) -> int | str:
    """The task's training examples as its `info["train_sizes"]` counts them ("?" if it does
    not), for run descriptions."""
    sizes = task.info.get("train_sizes") if isinstance(task.info, dict) else None
    return sum(sizes.values()) if isinstance(sizes, dict) else "?"


def scheme_kwargs(task) -> dict:
    """The keyword arguments of `task.partition`'s scheme (`tasks.partition`), from a
    `tasks.task_config.TaskConfig`.

    >>> from tasks.task_config import TaskConfig
    >>> scheme_kwargs(TaskConfig(partition="dirichlet", dirichlet_alpha=0.1))
    {'alpha': 0.1}
    """
    if task.partition == "shards":
        return {"classes_per_client": task.classes_per_client}
    if task.partition == "dirichlet":
        return {"alpha": task.dirichlet_alpha}
    return {}


def split_like_clients(train_data, test_labels, seed: int) -> dict[str, np.ndarray]:
    """`partition.split_test_like_train` for a `ClientData` with `client_labels`: indices into
    `test_labels` per client of `train_data`, each client's class shares following its own
    training labels."""
    from tasks import partition as partition_lib

    ids = list(train_data.client_ids)
    labels = [np.asarray(train_data.client_labels(cid)) for cid in ids]
    stops = np.cumsum([len(y) for y in labels])
    parts = {cid: np.arange(stop - len(y), stop) for cid, y, stop in zip(ids, labels, stops)}
    return partition_lib.split_test_like_train(np.concatenate(labels), parts, test_labels, seed)
