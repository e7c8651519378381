"""A client's batches for one round: which examples, grouped how, padded how far.

Text examples are stored padded to the task's `sequence_length`; most are much shorter (SST-2:
9.4 words on average, 32 tokens of storage). A round of K local steps of batch B works on the
K·B examples `round_example_ids` draws, and either

* keeps them in drawn order, K consecutive batches (`in_order`), each padded to the stored
  length (the classic path), or
* sorts them by length and cuts K batches of neighbours (`length_bucketed`), each padded only
  to its own longest example, rounded up to a multiple of `WIDTH_MULTIPLE` by the text tasks
  (`trim_to_longest`), the K batches then visited in a seeded random order.

Both use the same K·B examples. A transformer with a padding mask gives each example the same
output whatever its padding, so the two differ only in which examples share a batch.

`variable_length_dataset` holds batches of different lengths as one `tf.data.Dataset` that TFF
can serialize (one flat array per feature and slice offsets), with a `None` sequence dimension.

Example:

>>> ids = round_example_ids(num_examples=5, local_steps=2, batch_size=3, seed=0)
>>> len(ids), sorted(ids[:5].tolist())
(6, [0, 1, 2, 3, 4])
>>> lengths = np.array([4, 1, 3, 1, 2])
>>> [lengths[b].tolist() for b in length_bucketed(np.arange(5), lengths, 2, seed=1)]
[[1, 1], [2, 3], [4]]
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

# Larger than any client's data here, so that `round_example_ids` is a full shuffle.
SHUFFLE_BUFFER = 10_000


def round_example_ids(num_examples: int, local_steps: int, batch_size: int, seed: int
                      ) -> np.ndarray:
    """The K·B example indices a client trains on in one round, in order: the client's
    examples shuffled with `seed` (the same permutation every pass), repeated, cut to
    `local_steps · batch_size`. It is exactly the order of
    `dataset.shuffle(SHUFFLE_BUFFER, seed, reshuffle_each_iteration=False).repeat()` over the
    client's `num_examples` examples.

    Raises:
      ValueError: the client has no examples.
    """
    if num_examples <= 0:
        raise ValueError("a client has no training examples; every sampled client needs at "
                         "least one (use fewer clients)")
    count = local_steps * batch_size
    if count <= 0:
        return np.empty(0, np.int64)
    order = (tf.data.Dataset.range(num_examples)
             .shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=False)
             .repeat().batch(count))  # one read of all K·B ids, not K·B Python steps
    return next(iter(order.as_numpy_iterator())).astype(np.int64)


def in_order(ids: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Consecutive batches of `batch_size` (the last one smaller if it does not divide)."""
    return [ids[k:k + batch_size] for k in range(0, len(ids), batch_size)]


def length_bucketed(ids: np.ndarray, lengths: np.ndarray, batch_size: int, seed: int
                    ) -> list[np.ndarray]:
    """The same examples, sorted by `lengths[id]` (stably), cut into batches of `batch_size`,
    the batches in an order drawn with `seed`."""
    ids = np.asarray(ids)
    by_length = ids[np.argsort(np.asarray(lengths)[ids], kind="stable")]
    batches = in_order(by_length, batch_size)
    order = np.random.default_rng(seed).permutation(len(batches))
    return [batches[k] for k in order]


# Trimmed batches are cut at a multiple of this many positions. TensorFlow's oneDNN kernels keep
# their primitives per thread for each input shape they meet (`MklPrimitiveFactory`), in the
# driver and in a TFF worker alike; batches of a few widths, not one per length, keep few and
# build few (docs/PERFORMANCE.md, "Batch widths in multiples of 8").
WIDTH_MULTIPLE = 8


def trimmed_width(lengths: np.ndarray, multiple: int = 1, limit: int | None = None) -> int:
    """The width a batch of examples of `lengths` is cut at: its longest, rounded up to a
    multiple of `multiple`, at most `limit` (the stored width) but never below the longest.

    >>> trimmed_width(np.array([3, 9, 5])), trimmed_width(np.array([3, 9, 5]), 8)
    (9, 16)
    >>> trimmed_width(np.array([3, 9, 5]), 8, limit=12)
    12
    """
    longest = max(int(np.max(lengths)), 1)
    if multiple < 1:
        raise ValueError(f"width multiple {multiple}: pass 1 (no rounding) or more")
    width = -(-longest // multiple) * multiple
    return width if limit is None else max(min(width, int(limit)), longest)


def trim_to_longest(batch, lengths: np.ndarray, sequence_keys: Sequence[str], multiple: int = 1):
    """`batch` (a dict of arrays (B, L, ...), possibly nested in a tuple with labels) with the
    `sequence_keys` cut to the batch's longest example, `max(lengths)` positions, rounded up to
    a multiple of `multiple` (at most L: `trimmed_width`)."""

    def cut(features):
        stored = min(v.shape[1] for k, v in features.items() if k in sequence_keys)
        width = trimmed_width(lengths, multiple, stored)
        return collections.OrderedDict(
            (k, v[:, :width] if k in sequence_keys else v) for k, v in features.items())

    if isinstance(batch, tuple):
        return (cut(batch[0]), *batch[1:])
    return cut(batch)


def variable_length_dataset(batches: Sequence, directory: str | None = None
                            ) -> tf.data.Dataset:
    """A dataset whose elements are `batches` (same structure, numpy leaves whose first two
    dimensions may differ from batch to batch). Each leaf is held once as a flat array with
    per-batch offsets and shapes; the element spec has `None` in dimensions 0 and 1.

    With `directory`, the flat arrays are written there (raw bytes, one file per leaf) and the
    dataset reads them when it is iterated: its graph holds paths and offsets only, so a TFF
    computation that receives it receives no batch data, and the worker reads one client's
    files at a time. The files must outlive the dataset's use.

    Raises:
      ValueError: no batches, or batches of different structure.
    """
    if not batches:
        raise ValueError("no batches to make a dataset of")
    flat = [tf.nest.flatten(b) for b in batches]
    if len({len(f) for f in flat}) != 1:
        raise ValueError("batches have different structures")
    columns = []
    for j in range(len(flat[0])):
        leaves = [np.asarray(f[j]) for f in flat]
        if (len({leaf.ndim for leaf in leaves}) != 1
                or len({leaf.shape[2:] for leaf in leaves}) != 1):
            raise ValueError(f"feature {j}: batches differ beyond their first two dimensions")
        if len({leaf.dtype for leaf in leaves}) != 1:
            raise ValueError(f"feature {j}: batches have different dtypes")
        sizes = np.array([leaf.size for leaf in leaves], np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        shapes = np.array([leaf.shape for leaf in leaves], np.int64)
        static = [None] * min(leaves[0].ndim, 2) + list(leaves[0].shape[2:])
        if directory is None:
            source = np.concatenate([leaf.reshape(-1) for leaf in leaves])
        else:
            source = os.path.join(directory, f"feature_{j}.bin")
            with open(source, "wb") as f:
                for leaf in leaves:
                    np.ascontiguousarray(leaf).tofile(f)
        columns.append((source, leaves[0].dtype, starts, sizes, shapes, static))

    structure = tf.nest.map_structure(lambda _: 0, batches[0])  # not the batches themselves
    index = tf.data.Dataset.from_tensor_slices(
        tuple((starts, sizes, shapes) for _, _, starts, sizes, shapes, _ in columns))
    dtypes = tuple(np.dtype(c[1]).name for c in columns)
    if directory is None:
        values = tf.data.Dataset.from_tensors(tuple(c[0] for c in columns))
    else:
        paths = tuple(c[0] for c in columns)
        values = tf.data.Dataset.from_tensors(paths).map(_file_reader(dtypes)).cache()
    element = _element_builder(structure, dtypes, tuple(tuple(c[5]) for c in columns))
    return tf.data.Dataset.zip((index, values.repeat())).map(element)


# `variable_length_dataset` runs once per client per round. Its map functions are `tf.function`s
# kept per dtypes and shapes, so that building a dataset reuses their traces (tracing them anew
# each time was most of its cost).
_READERS: dict = {}
_BUILDERS: dict = {}


def _file_reader(dtypes: tuple[str, ...]):
    """paths -> the flat arrays in them (raw bytes of `dtypes`)."""
    if dtypes not in _READERS:
        @tf.function(input_signature=[tf.TensorSpec([], tf.string) for _ in dtypes],
                     autograph=False)
        def read(*paths):
            return tuple(tf.io.decode_raw(tf.io.read_file(path), tf.as_dtype(dtype))
                         for path, dtype in zip(paths, dtypes))

        _READERS[dtypes] = read
    return _READERS[dtypes]


def _element_builder(structure, dtypes: tuple[str, ...], statics: tuple[tuple, ...]):
    """(per-leaf (start, size, shape), per-leaf flat arrays) -> the batch (`structure`)."""
    key = (repr(structure), dtypes, statics)
    if key not in _BUILDERS:
        index_spec = tuple((tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64),
                            tf.TensorSpec([None], tf.int64)) for _ in dtypes)
        flat_spec = tuple(tf.TensorSpec([None], tf.as_dtype(dtype)) for dtype in dtypes)

        @tf.function(input_signature=[index_spec, flat_spec], autograph=False)
        def element(slices, flats):
            leaves = []
            for (start, size, shape), values_j, static in zip(slices, flats, statics):
                leaf = tf.reshape(values_j[start:start + size], shape)
                leaf.set_shape(static)
                leaves.append(leaf)
            return tf.nest.pack_sequence_as(structure, leaves)

        _BUILDERS[key] = element
    return _BUILDERS[key]
