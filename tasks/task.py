"""A task bundles federated client data, its evaluation data and a model-builder slot.

`Task` holds:

* `train_data`: `ClientData` of unbatched (x, y) examples, one client per partition part;
* `test_data`: per-client test `ClientData` whose labels follow each client's own training label
  distribution (`partition.split_test_like_train`) or, for natural groups, the client's own
  domain. Clients whose test share is empty are left out of it;
* `global_test_data`: `tf.data.Dataset` of the whole test set (unbatched);
* `element_spec`: the (x, y) `TensorSpec` structure of one unbatched example;
* `num_classes`, `name`, `info` (partition sizes, label counts);
* `model_fn`: a slot the caller fills with a zero-argument Keras model builder.

Builders: `build_task` (numpy features + labels, any scheme), `text_task` (tokenizes once), and
concrete tasks `digits_task`, `mnist_csv_task`, `mnist_tfds_task`, `sst2_tsv_task`,
`glue_tfds_task`, `review_task` (five review domains as natural non-IID clients).

Batch with `task.train_data.preprocess(client_data.preprocess_fn(batch_size, ...))`.

Example:

>>> task = digits_task(num_clients=5, scheme="shards", classes_per_client=2, seed=0)
>>> len(task.train_data.client_ids), task.num_classes
(5, 10)
"""

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import client_data as client_data_lib
from tasks import images
from tasks import partition as partition_lib
from tasks import partition_schemes
from tasks import text as text_lib
from tasks import text_files
from tasks.text_files import TextExamples


@dataclasses.dataclass
class Task:
    """Federated data and evaluation for one problem; `model_fn` is filled by the caller.

    Example:

    >>> task = digits_task(num_clients=3)
    >>> task.model_fn = lambda: tf.keras.Sequential([tf.keras.layers.Dense(task.num_classes)])
    """

    name: str
    train_data: tff.simulation.datasets.ClientData
    test_data: tff.simulation.datasets.ClientData
    global_test_data: tf.data.Dataset
    element_spec: Any
    num_classes: int
    model_fn: Callable[[], tf.keras.Model] | None = None
    info: dict = dataclasses.field(default_factory=dict)


def holdout_split(labels, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stratified (train_idx, test_idx): round(test_fraction · n_c) of each class c go to test.

    Example:

    >>> tr, te = holdout_split(np.repeat([0, 1], 10), 0.2)
    >>> len(tr), len(te)
    (16, 4)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(test_fraction * len(idx)))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@dataclasses.dataclass(frozen=True)
class Examples:
    """One split of a task's data.

    Attributes:
      x: features, an array (n, ...) or a dict of such arrays.
      y: int labels (n,).
      groups: each example's natural group (n,) (e.g. a domain, or a user's client id), or None.
    """

    x: Any
    y: np.ndarray
    groups: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Partitioning:
    """How a task's examples become clients.

    Without training groups, the label scheme `scheme` ("iid", "shards", "dirichlet"; see
    `tasks.partition`, with `options` such as `classes_per_client` or `alpha`) cuts the training
    examples into `num_clients`, and the test examples follow each client's label shares
    (`split_test_like_train`). With training groups, `partition_schemes.by_group` makes one client per
    group (or `clients_per_group` per group); test examples with groups go to their group's
    client, test examples without follow the label shares.

    Attributes:
      num_classes: C.
      num_clients: N for label schemes.
      scheme: the label scheme.
      seed: the partition seed.
      clients_per_group: clients each natural group is split into.
      options: the scheme's keyword arguments.
    """

    num_classes: int
    num_clients: int | None = None
    scheme: str = "iid"
    seed: int = 0
    clients_per_group: int = 1
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def build_task(name: str, train: Examples, test: Examples, partitioning: Partitioning) -> Task:
    """Partition numpy data into a `Task` (`Partitioning` says how).

    Returns:
      Task (model_fn unset).

    Example:

    >>> x, y = np.random.rand(40, 3).astype(np.float32), np.arange(40) % 4
    >>> t = build_task("toy", Examples(x, y), Examples(x, y),
    ...                Partitioning(4, num_clients=4, scheme="shards",
    ...                             options={"classes_per_client": 1}))
    >>> sorted(t.info["train_sizes"].values())
    [10, 10, 10, 10]
    """
    p = partitioning
    train_y = np.asarray(train.y)
    test_y = np.asarray(test.y)
    scheme = p.scheme
    if train.groups is not None:
        train_parts = partition_schemes.by_group(train.groups, p.clients_per_group, p.seed)
        scheme = "by_group"
    elif p.num_clients is None:
        raise ValueError(f"scheme {scheme!r} needs num_clients")
    else:
        train_parts = partition_schemes.partition(train_y, p.num_clients, scheme, p.seed,
                                              **p.options)
    if test.groups is not None and train.groups is not None:
        test_parts = _test_parts_by_group(train_parts, test.groups, p)
    else:
        test_parts = partition_lib.split_test_like_train(train_y, train_parts, test_y, p.seed)
    train_data = client_data_lib.ArrayClientData(train.x, train_y, train_parts)
    non_empty = {cid: idx for cid, idx in test_parts.items() if len(idx)}
    if not non_empty:
        raise ValueError("the test set left every client without test examples")
    test_data = client_data_lib.ArrayClientData(test.x, test_y, non_empty)
    info = {
        "scheme": scheme,
        "seed": p.seed,
        "train_sizes": {cid: len(idx) for cid, idx in train_parts.items()},
        "test_sizes": {cid: len(idx) for cid, idx in test_parts.items()},
        "train_label_counts": partition_lib.label_counts(train_y, train_parts, p.num_classes),
        **p.options,
    }
    return Task(
        name=name,
        train_data=train_data,
        test_data=test_data,
        global_test_data=client_data_lib.tensor_dataset(test.x, test_y),
        element_spec=train_data.element_type_structure,
        num_classes=p.num_classes,
        info=info,
    )


def _test_parts_by_group(train_parts, test_groups, p: Partitioning):
    """Natural partitions of the test split (`partition_schemes.by_group`): its clients must be among
    the training clients; a training client without test examples gets none."""
    test_parts = partition_schemes.by_group(test_groups, p.clients_per_group, p.seed)
    unknown = [cid for cid in test_parts if cid not in train_parts]
    if unknown:
        raise ValueError(f"test groups give clients {unknown} that the train groups do not "
                         f"(train groups give clients {list(train_parts)})")
    return {cid: test_parts.get(cid, np.zeros(0, np.int64)) for cid in train_parts}


def digits_task(
    num_clients: int = 10,
    scheme: str = "iid",
    seed: int = 0,
    test_fraction: float = 0.2,
    **scheme_kwargs,
) -> Task:
    """scikit-learn digits (x: 64 floats in [0, 1]), stratified holdout test set, 10 classes.

    Example:

    >>> digits_task(num_clients=4, scheme="dirichlet", alpha=0.5).element_spec[0].shape
    TensorShape([64])
    """
    x, y = images.load_digits()
    tr, te = holdout_split(y, test_fraction, seed)
    return build_task("digits", Examples(x[tr], y[tr]), Examples(x[te], y[te]),
                      Partitioning(10, num_clients, scheme, seed, options=scheme_kwargs))


def mnist_csv_task(
    path: str | os.PathLike,
    num_clients: int = 10,
    scheme: str = "iid",
    seed: int = 0,
    test_fraction: float = 0.2,
    **scheme_kwargs,
) -> Task:
    """MNIST from a CSV file (`images.load_mnist_csv`), stratified holdout test set.

    Example:

    >>> t = mnist_csv_task("../shared/data/mnist/mnist_5k.csv.gz", 20)  # doctest: +SKIP
    """
    x, y = images.load_mnist_csv(path)
    tr, te = holdout_split(y, test_fraction, seed)
    return build_task("mnist_csv", Examples(x[tr], y[tr]), Examples(x[te], y[te]),
                      Partitioning(10, num_clients, scheme, seed, options=scheme_kwargs))


def mnist_tfds_task(
    num_clients: int = 10,
    scheme: str = "iid",
    seed: int = 0,
    data_dir: str | None = None,
    **scheme_kwargs,
) -> Task:
    """MNIST through TFDS: train split partitioned, test split as the global/per-client test."""
    x, y = images.load_mnist_tfds("train", data_dir)
    x_te, y_te = images.load_mnist_tfds("test", data_dir)
    return build_task("mnist", Examples(x, y), Examples(x_te, y_te),
                      Partitioning(10, num_clients, scheme, seed, options=scheme_kwargs))


def text_task(
    name: str,
    train: TextExamples,
    test: TextExamples,
    preprocessor: Callable[[tuple], dict],
    partitioning: Partitioning,
    groups: tuple = (None, None),
) -> Task:
    """Tokenize train and test once (`text.tokenize`) and partition them into a `Task`
    (`groups`: the train and test examples' natural groups, or None each).

    x is the BERT input dict {"token_ids", "segment_ids", "padding_mask"} (int32, (L,) per
    example), y the int32 label.

    Example:

    >>> t = text_task("sst2", data["train"], data["dev"], packer, Partitioning(2, 50))  # doctest: +SKIP
    """
    train_x = text_lib.tokenize(train.segments, preprocessor)
    test_x = text_lib.tokenize(test.segments, preprocessor)
    return build_task(name, Examples(train_x, train.labels, groups[0]),
                      Examples(test_x, test.labels, groups[1]), partitioning)


def sst2_tsv_task(
    directory: str | os.PathLike,
    preprocessor: Callable[[tuple], dict],
    num_clients: int = 10,
    scheme: str = "iid",
    seed: int = 0,
    test_split: str = "dev",
    **scheme_kwargs,
) -> Task:
    """SST-2 from a GLUE-layout folder (train.tsv partitioned; `test_split` for evaluation).

    Example:

    >>> t = sst2_tsv_task("../shared/data/sst2", bert_packer(vocab, 64), 50)  # doctest: +SKIP
    """
    data = text_files.load_glue_tsv(directory, "sst2", splits=("train", test_split))
    return text_task("sst2", data["train"], data[test_split], preprocessor,
                     Partitioning(2, num_clients, scheme, seed, options=scheme_kwargs))


def glue_tfds_task(
    task: str,
    preprocessor: Callable[[tuple], dict],
    partitioning: Partitioning,
    splits: tuple[str, str | None] = ("train", None),
    data_dir: str | None = None,
) -> Task:
    """A GLUE task through TFDS (`glue/<task>`), tokenized and partitioned (`partitioning`'s
    `num_classes` is the task's own); `splits` are the training and test splits, the test one
    defaulting to "validation_matched" for MNLI and "validation" otherwise.

    Example:

    >>> t = glue_tfds_task("qnli", packer, Partitioning(2, 20, "dirichlet",  # doctest: +SKIP
    ...                                                 options={"alpha": 0.5}))
    """
    from tasks import glue_tfds  # local import: TFDS is heavy

    train_split, test_split = splits
    if test_split is None:
        test_split = "validation_matched" if task == "mnli" else "validation"
    train = glue_tfds.load_glue_tfds(task, train_split, data_dir)
    test = glue_tfds.load_glue_tfds(task, test_split, data_dir)
    partitioning = dataclasses.replace(partitioning,
                                       num_classes=text_files.GLUE_NUM_CLASSES[task])
    return text_task(task, train, test, preprocessor, partitioning)


def review_task(
    root: str | os.PathLike,
    preprocessor: Callable[[tuple], dict],
    clients_per_domain: int = 1,
    domains: Sequence[str] = text_files.REVIEW_DOMAINS,
    train_split: str = "train",
    test_split: str = "test-labeled",
    seed: int = 0,
) -> Task:
    """Multi-domain review sentiment, one domain per client (or per `clients_per_domain` clients).

    Client ids are the domain names (or `<domain>_<j>`); each client's test data are drawn from its
    own domain's `test_split`, and the global test set is all domains' `test_split`.

    Example:

    >>> t = review_task("../shared/data/multidomain_sentiment", packer)  # doctest: +SKIP
    >>> t.train_data.client_ids  # doctest: +SKIP
    ['airline', 'books', 'dvd', 'electronics', 'kitchen']
    """
    data = text_files.load_review_domains(root, domains, splits=(train_split, test_split))
    train = TextExamples.concatenate([data[d][train_split] for d in domains])
    test = TextExamples.concatenate([data[d][test_split] for d in domains])
    train_groups = np.concatenate([[d] * len(data[d][train_split]) for d in domains])
    test_groups = np.concatenate([[d] * len(data[d][test_split]) for d in domains])
    return text_task("reviews", train, test, preprocessor,
                     Partitioning(2, seed=seed, clients_per_group=clients_per_domain),
                     groups=(train_groups, test_groups))


__all__: Sequence[str] = (
    "Examples",
    "Partitioning",
    "Task",
    "build_task",
    "digits_task",
    "glue_tfds_task",
    "holdout_split",
    "mnist_csv_task",
    "mnist_tfds_task",
    "review_task",
    "sst2_tsv_task",
    "text_task",
)
