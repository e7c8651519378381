"""`tff.simulation.datasets.ClientData` over in-memory numpy arrays and a partition.

`ArrayClientData` keeps the features x (an array of shape (n, ...) or a dict of such arrays) and
the labels y (shape (n,): int32 classes or float32 regression targets) once, plus each
client's index array. Client i's dataset yields the
unbatched Keras-ready tuples (x[j], y[j]) for j in its indices, in index order. Two code paths
give the same elements:

* `create_tf_dataset_for_client(id)`: numpy slicing in Python (fast; what simulations iterate);
* `serializable_dataset_fn(id)`: a TF-traceable function (for `dataset_computation` and
  `create_tf_dataset_from_all_clients`) that embeds the arrays as graph constants, built lazily.

`preprocess_fn` builds the usual per-client pipeline (seeded shuffle, repeat, batch) to pass to
`ClientData.preprocess`.

Example:

>>> x = np.arange(12, dtype=np.float32).reshape(6, 2)
>>> y = np.array([0, 1, 0, 1, 0, 1])
>>> cd = ArrayClientData(x, y, {"a": np.array([0, 1]), "b": np.array([2, 3, 4, 5])})
>>> [int(t) for _, t in cd.create_tf_dataset_for_client("b")]
[0, 1, 0, 1]
"""

from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tffl  # noqa: F401  (its exit hook stops TFF's workers and drops TFF's default context)

Features = np.ndarray | Mapping[str, np.ndarray]


def _num_rows(features: Features) -> int:
    leaves = list(features.values()) if isinstance(features, Mapping) else [features]
    sizes = {len(leaf) for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"feature arrays have different numbers of rows: {sorted(sizes)}")
    return sizes.pop()


def take_rows(features: Features, idx: np.ndarray) -> Features:
    """Rows `idx` of an array or of every array in a dict (numpy fancy indexing)."""
    if isinstance(features, Mapping):
        return {k: np.asarray(v)[idx] for k, v in features.items()}
    return np.asarray(features)[idx]


def as_labels(labels) -> np.ndarray:
    """Integer labels as int32 (classification), anything else as float32 (regression targets)."""
    labels = np.asarray(labels)
    return labels.astype(np.int32 if np.issubdtype(labels.dtype, np.integer) else np.float32)


def tensor_dataset(features: Features, labels: np.ndarray) -> tf.data.Dataset:
    """`tf.data.Dataset` of unbatched (x, y) tuples from numpy arrays (e.g. a global test set).

    Integer labels become int32, other labels (regression targets) float32.

    Example:

    >>> ds = tensor_dataset(np.zeros((3, 2), np.float32), np.array([0, 1, 1]))
    >>> ds.element_spec[1]
    TensorSpec(shape=(), dtype=tf.int32, name=None)
    """
    features = dict(features) if isinstance(features, Mapping) else features
    return tf.data.Dataset.from_tensor_slices((features, as_labels(labels)))


class ArrayClientData(tff.simulation.datasets.ClientData):
    """Clients defined by index arrays into shared numpy features and integer labels.

    Args:
      features: array of shape (n, ...) or dict name -> array of shape (n, ...).
      labels: array of shape (n, ...): integer class labels (stored as int32) or real-valued
        targets (stored as float32).
      parts: client id -> indices into the n rows; every client must be non-empty.

    Raises:
      ValueError: mismatched row counts, an empty client, or an index out of range.

    Example:

    >>> cd = ArrayClientData(np.eye(3, dtype=np.float32), np.arange(3), {"c0": np.array([2])})
    >>> cd.element_type_structure[0].shape
    TensorShape([3])
    """

    def __init__(self, features: Features, labels, parts: Mapping[str, np.ndarray]):
        super().__init__()
        self._features = dict(features) if isinstance(features, Mapping) else np.asarray(features)
        self._labels = as_labels(labels)
        n = _num_rows(self._features)
        if len(self._labels) != n:
            raise ValueError(f"{n} feature rows but {len(self._labels)} labels")
        if not parts:
            raise ValueError("a ClientData needs at least one client")
        self._parts = {}
        for cid, idx in parts.items():
            idx = np.asarray(idx, dtype=np.int64)
            if idx.size == 0:
                raise ValueError(f"client {cid!r} has no examples")
            if idx.min() < 0 or idx.max() >= n:
                raise ValueError(f"client {cid!r} has indices outside [0, {n})")
            self._parts[str(cid)] = idx
        self._ids = list(self._parts)
        first = self.create_tf_dataset_for_client(self._ids[0])
        self._element_spec = first.element_spec
        self._graph_fn = None

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def element_type_structure(self):
        return self._element_spec

    def client_size(self, client_id: str) -> int:
        """Number of examples of `client_id`."""
        return len(self._parts[client_id])

    def client_labels(self, client_id: str) -> np.ndarray:
        """Labels of `client_id`, in dataset order."""
        return self._labels[self._parts[client_id]]

    def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
        if client_id not in self._parts:
            raise ValueError(f"ID [{client_id}] is not a client in this ClientData")
        idx = self._parts[client_id]
        return tensor_dataset(take_rows(self._features, idx), self._labels[idx])

    @property
    def serializable_dataset_fn(self) -> Callable[[str], tf.data.Dataset]:
        if self._graph_fn is None:
            self._graph_fn = self._build_graph_fn()
        return self._graph_fn

    def _build_graph_fn(self) -> Callable[[str], tf.data.Dataset]:
        ids = np.array(self._ids)
        order = np.concatenate([self._parts[c] for c in self._ids])
        offsets = np.concatenate([[0], np.cumsum([len(self._parts[c]) for c in self._ids])])
        features, labels = self._features, self._labels

        def dataset_fn(client_id):
            pos = tf.reshape(tf.where(tf.equal(tf.constant(ids), client_id)), [-1])
            tf.debugging.assert_equal(tf.size(pos), 1, message="unknown client id")
            k = pos[0]
            idx = tf.constant(order)[tf.constant(offsets)[k] : tf.constant(offsets)[k + 1]]
            x = tf.nest.map_structure(tf.constant, features)
            y = tf.constant(labels)
            return tf.data.Dataset.from_tensor_slices(idx).map(
                lambda i: (tf.nest.map_structure(lambda a: tf.gather(a, i), x), tf.gather(y, i))
            )

        return dataset_fn


def preprocess_fn(
    batch_size: int,
    num_epochs: int = 1,
    shuffle_buffer: int = 0,
    seed: int | None = 0,
    drop_remainder: bool = False,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """Per-client pipeline for `ClientData.preprocess`: seeded shuffle, repeat, batch, prefetch.

    Shuffling is reshuffled each epoch but fixed by `seed` (same seed -> same order). With
    `shuffle_buffer=0` the order is unchanged.

    Example:

    >>> fn = preprocess_fn(batch_size=2, shuffle_buffer=10, seed=1)
    >>> [b[1].shape[0] for b in fn(tensor_dataset(np.zeros((5, 1)), np.zeros(5)))]
    [2, 2, 1]
    """

    def fn(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if shuffle_buffer > 0:
            dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if num_epochs != 1:
            dataset = dataset.repeat(num_epochs)
        return dataset.batch(batch_size, drop_remainder=drop_remainder).prefetch(
            tf.data.AUTOTUNE
        )

    return fn
