"""Clients' text batches per round, optionally on cached frozen-prefix outputs.

`TextRounds` turns a text `ClientData` (features padded to the task's sequence length, a
`padding_mask` among them) into each client's round data, `(cid, round) -> tf.data.Dataset`:
the K·B examples of `tasks.batching.round_example_ids`, batched in drawn order or by length
(`tasks.batching`), as token features, or, with a `PrefixCache`, as the frozen prefix's output
h_k (`models.prefix`) that a suffix classifier starts from.

`PrefixCache` computes h_k = prefix(x) once per example, the first time a round needs it, in
batches of similar length cut to their longest example, and keeps each example's h_k at its own
length (len_i × hidden float32) in memory for the rest of the run.

Example:

>>> import collections
>>> features = collections.OrderedDict(
...     padding_mask=np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.int32),
...     token_ids=np.array([[5, 6, 0], [7, 0, 0], [8, 9, 4]], np.int32))
>>> examples = ClientExamples(features, np.array([0, 1, 0], np.int32))
>>> examples.lengths.tolist()
[2, 1, 3]
>>> rounds = TextRounds({"a": examples}, RoundDraw(local_steps=2, batch_size=2, seed=0))
>>> [b[0]["token_ids"].shape[1] for b in rounds.batches("a", round_num=0)]
[3, 2]
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from tasks import batching

PADDING_MASK = "padding_mask"
# Elements per read when `ClientExamples.from_dataset` reads fixed-shape examples in chunks.
_READ_CHUNK = 4096


@dataclasses.dataclass
class ClientExamples:
    """One client's examples as arrays: `features` (name -> (n, L)), `labels` (n,); the length
    of example i is the number of ones in its padding mask."""

    features: Mapping[str, np.ndarray]
    labels: np.ndarray

    def __post_init__(self):
        if PADDING_MASK not in self.features:
            raise ValueError(f"text features need a {PADDING_MASK!r}; got {sorted(self.features)}")
        self.lengths = np.asarray(self.features[PADDING_MASK]).sum(axis=1).astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    @classmethod
    def from_dataset(cls, dataset: tf.data.Dataset) -> "ClientExamples":
        """From unbatched `(features dict, label)` elements. Elements of one fixed shape (the
        padded text features) are read in chunks of `_READ_CHUNK`: one Python step per element
        made this the slowest part of a run's start (tens of thousands of sentences)."""
        specs = tf.nest.flatten(dataset.element_spec)
        if all(spec.shape.is_fully_defined() for spec in specs):
            chunks = list(dataset.batch(_READ_CHUNK).as_numpy_iterator())
            if not chunks:
                raise ValueError("a client has no examples")
            features = collections.OrderedDict(
                (k, np.concatenate([c[0][k] for c in chunks])) for k in sorted(chunks[0][0]))
            return cls(features, np.concatenate([c[1] for c in chunks]))
        rows = list(dataset.as_numpy_iterator())
        if not rows:
            raise ValueError("a client has no examples")
        features = collections.OrderedDict(
            (k, np.stack([r[0][k] for r in rows])) for k in sorted(rows[0][0]))
        return cls(features, np.array([r[1] for r in rows]))

    def batch(self, ids: np.ndarray, trim: bool, width_multiple: int = 1):
        """`(features, labels)` of `ids`, cut to their longest example when `trim` (rounded up
        to a multiple of `width_multiple`, `batching.trim_to_longest`)."""
        batch = (collections.OrderedDict((k, v[ids]) for k, v in self.features.items()),
                 self.labels[ids])
        if trim:
            return batching.trim_to_longest(batch, self.lengths[ids], tuple(self.features),
                                            width_multiple)
        return batch


class PrefixCache:
    """h_k of every example, computed once by `prefix` and kept per client.

    Args:
      prefix: a Keras model `features -> {"hidden": (B, L, H), "padding_mask": (B, L)}`
        (`models.prefix.build_prefix_model`) holding the frozen weights.
      compute_batch_size: examples per prefix call.
      dtype: the precision h_k is kept at ("float32", or "float16": half the memory); `batch`
        widens it back to float32.
    """

    def __init__(self, prefix: tf.keras.Model | Callable[[], tf.keras.Model],
                 compute_batch_size: int = 64, dtype: str = "float32"):
        from tasks.task_config import PREFIX_CACHE_DTYPES

        if dtype not in PREFIX_CACHE_DTYPES:
            raise ValueError(f"prefix cache dtype {dtype!r}: choose from "
                             f"{', '.join(PREFIX_CACHE_DTYPES)}")
        self._prefix = prefix
        self.compute_batch_size = compute_batch_size
        self.dtype = np.dtype(dtype)
        self._hidden: dict[str, list] = {}
        self.computed = 0  # examples passed through the prefix so far
        self.seconds = 0.0  # time spent computing them
        self._call = None
        # The simulation loop builds a round's batches on a background thread while evaluation
        # reads h_k on the main one (`tffl.simulation.driver.run_rounds(prefetch=True)`).
        self._lock = threading.RLock()

    def prefix_model(self) -> tf.keras.Model:
        """The prefix model (built now, when the cache was given a function that builds it)."""
        return self._prefix if isinstance(self._prefix, tf.keras.Model) else self._prefix()

    def _compute(self, features) -> np.ndarray:
        if self._call is None:
            # Built on first use, and traced once for every batch and sequence length: Keras
            # swaps its layer classes' bases whenever a model is built in a `tf.compat.v1` graph
            # (as TFF does), which breaks later Python calls of an eager model, but not a
            # concrete function traced while the model was valid.
            prefix = self.prefix_model()
            spec = {k: tf.TensorSpec([None, None], v.dtype) for k, v in features.items()}
            self._model = prefix
            self._call = tf.function(lambda x: prefix(x, training=False)["hidden"]
                                     ).get_concrete_function(spec)
        return self._call({k: tf.constant(v) for k, v in features.items()}).numpy()

    def hidden(self, cid: str, examples: ClientExamples, ids: np.ndarray) -> list[np.ndarray]:
        """h_k of examples `ids` of client `cid`, each (len_i, H) at `dtype`; computes the missing
        ones."""
        with self._lock:
            return self._hidden_locked(cid, examples, ids)

    def _hidden_locked(self, cid: str, examples: ClientExamples, ids: np.ndarray) -> list:
        store = self._hidden.setdefault(cid, [None] * len(examples))
        missing = np.unique([i for i in ids if store[i] is None]).astype(np.int64)
        if len(missing):
            started = time.perf_counter()
            by_length = missing[np.argsort(examples.lengths[missing], kind="stable")]
            for chunk in batching.in_order(by_length, self.compute_batch_size):
                features, _ = examples.batch(chunk, trim=True)
                out = self._compute(features)
                for row, i in enumerate(chunk):
                    store[i] = out[row, :examples.lengths[i]].astype(self.dtype)  # a copy
            self.computed += len(missing)
            self.seconds += time.perf_counter() - started
        return [store[i] for i in ids]

    def batch(self, cid: str, examples: ClientExamples, ids: np.ndarray, width_multiple: int = 1):
        """`({"hidden": (B, L_b, H), "padding_mask": (B, L_b)}, labels)`, L_b the batch's
        longest example rounded up to a multiple of `width_multiple` (at most the stored width,
        `batching.trimmed_width`), padded positions zero; `hidden` in float32."""
        states = self.hidden(cid, examples, ids)
        longest = batching.trimmed_width(np.array([len(h) for h in states]), width_multiple,
                                         examples.features[PADDING_MASK].shape[1])
        hidden = np.zeros((len(ids), longest, states[0].shape[-1]), np.float32)
        mask = np.zeros((len(ids), longest), np.int32)
        for row, h in enumerate(states):
            hidden[row, :len(h)] = h
            mask[row, :len(h)] = 1
        return (collections.OrderedDict(hidden=hidden, padding_mask=mask), examples.labels[ids])

    @property
    def examples_cached(self) -> int:
        with self._lock:
            return sum(sum(h is not None for h in store) for store in self._hidden.values())


@dataclasses.dataclass(frozen=True)
class RoundDraw:
    """How a client's round is drawn: `local_steps` (K) batches of `batch_size` (B), seeded by
    (`seed`, round, client); with `bucket_by_length`, batches of similar length, each cut to its
    longest example (rounded up to a multiple of `width_multiple`), else the drawn order and the
    stored padding (the classic path)."""

    local_steps: int
    batch_size: int
    seed: int = 0
    bucket_by_length: bool = True
    width_multiple: int = 1


class TextRounds:
    """`(cid, round) -> dataset` of a client's K batches of B for one round.

    Args:
      clients: cid -> its `ClientExamples`, or a function loading them on first use.
      draw: the round's K, B, seed and batching (`RoundDraw`).
      cache: a `PrefixCache`: the batches carry h_k instead of token features.
      client_ids: the clients in order (their index seeds their rounds); default `clients`'s.
      name: the split's name, keying its examples in `cache`.
      storage_dir: if given, each dataset's arrays are written there and the dataset reads
        them when iterated (`batching.variable_length_dataset(directory=...)`), so that a TFF
        computation receives paths and its worker reads one client's batches at a time, instead
        of receiving every client's batches inside the call (h_k is `hidden` floats per token:
        200 clients' rounds at MiniLM width would otherwise all sit in the call's arguments).
        A round's files are deleted when the round two later is written.
    """

    def __init__(self, clients: Mapping[str, ClientExamples] | Callable[[str], ClientExamples],
                 draw: RoundDraw, cache: PrefixCache | None = None, client_ids=None,
                 name: str = "train", storage_dir: str | None = None):
        self._clients = clients
        self._loaded: dict[str, ClientExamples] = {}
        self._loading = threading.Lock()  # `examples` may be asked from two threads at once
        if client_ids is None and callable(clients):
            raise ValueError("TextRounds needs client_ids when clients is a loading function")
        self.client_ids = list(client_ids if client_ids is not None else clients)
        self._index = {cid: i for i, cid in enumerate(self.client_ids)}
        self.draw = draw
        self.local_steps, self.batch_size, self.seed = draw.local_steps, draw.batch_size, draw.seed
        self.bucket_by_length, self.cache = draw.bucket_by_length, cache
        self.name = name  # distinguishes the cache entries of a train and a test split
        self.storage_dir = storage_dir

    def examples(self, cid: str) -> ClientExamples:
        with self._loading:
            if cid not in self._loaded:
                source = self._clients
                self._loaded[cid] = source(cid) if callable(source) else source[cid]
            return self._loaded[cid]

    def _seeds(self, cid: str, round_num: int) -> tuple[int, int]:
        # The first is the shuffle seed the classic tf.data pipeline used for (seed, t, client).
        index = self._index[cid]
        shuffle = int(np.random.SeedSequence((self.seed, round_num, index)).generate_state(1)[0])
        order = int(np.random.SeedSequence((self.seed, round_num, index, 1)).generate_state(1)[0])
        return shuffle, order

    def batch_ids(self, cid: str, round_num: int) -> list[np.ndarray]:
        examples = self.examples(cid)
        shuffle, order = self._seeds(cid, round_num)
        ids = batching.round_example_ids(len(examples), self.local_steps, self.batch_size,
                                         shuffle)
        if self.bucket_by_length:
            return batching.length_bucketed(ids, examples.lengths, self.batch_size, order)
        return batching.in_order(ids, self.batch_size)

    def batches(self, cid: str, round_num: int) -> list:
        return self.make_batches(cid, self.batch_ids(cid, round_num))

    def make_batches(self, cid: str, batch_ids) -> list:
        examples = self.examples(cid)
        multiple = self.draw.width_multiple
        if self.cache is not None:
            return [self.cache.batch(f"{self.name}/{cid}", examples, ids, multiple)
                    for ids in batch_ids]
        return [examples.batch(ids, self.bucket_by_length, multiple) for ids in batch_ids]

    def dataset(self, cid: str, round_num: int) -> tf.data.Dataset:
        batches = self.batches(cid, round_num)
        if self.storage_dir is None:
            return batching.variable_length_dataset(batches)
        stale = os.path.join(self.storage_dir, self.name, str(round_num - 2))
        if os.path.isdir(stale):
            shutil.rmtree(stale, ignore_errors=True)
        return batching.variable_length_dataset(
            batches, self._folder(os.path.join(str(round_num), cid)))

    def _folder(self, relative: str) -> str:
        path = os.path.join(self.storage_dir, self.name, relative)
        os.makedirs(path, exist_ok=True)
        return path

    def pass_order(self, cid: str) -> np.ndarray:
        """The order in which `one_pass` evaluates `cid`'s examples (their indices): by length
        with `bucket_by_length`, else as stored."""
        examples = self.examples(cid)
        ids = np.arange(len(examples))
        if self.bucket_by_length:
            ids = ids[np.argsort(examples.lengths, kind="stable")]
        return ids

    def one_pass(self, cid: str, batch_size: int) -> tf.data.Dataset:
        """Every example of `cid` once (evaluation), in batches of similar length
        (`pass_order`)."""
        ids = self.pass_order(cid)
        batches = self.make_batches(cid, batching.in_order(ids, batch_size))
        folder = None if self.storage_dir is None else self._folder(os.path.join("all", cid))
        return batching.variable_length_dataset(batches, folder)


@dataclasses.dataclass
class CachedClassifier:
    """A classifier split at its lowest trained encoder `start_layer` (`models.prefix`): the
    suffix the clients train, and the `PrefixCache` of h_k their data is made of."""

    start_layer: int
    keras_model_fn: Callable[[], tf.keras.Model]  # the suffix classifier
    input_spec: tuple
    non_trainable: Callable[[], list[np.ndarray]]  # the suffix's frozen values, from the whole
    cache: PrefixCache


@dataclasses.dataclass(frozen=True)
class ClassifierLayout:
    """How a classifier was built over its KerasNLP backbone (`models.backbones.build_classifier`):
    the LoRA adapters (`lora_config`, a `models.lora_targets.LoraConfig`), `num_classes`, the
    initializers' `seed`, the `pooling`, the `head` and its `head_dropout`."""

    lora_config: Any
    num_classes: int
    seed: int = 0
    pooling: str = "mean"
    head: str = "linear"
    head_dropout: float = 0.0


def split_for_cache(full_model_fn: Callable[[], tf.keras.Model],
                    full_non_trainable: Callable[[], list], layout: ClassifierLayout,
                    label_spec: tf.TensorSpec, cache_dtype: str = "float32"
                    ) -> CachedClassifier | None:
    """Splits the classifier `full_model_fn` builds (as `layout` describes it) at its lowest
    trained encoder.

    `full_non_trainable()` gives the whole model's starting frozen weights (a pretrained
    backbone, or a random draw); the prefix computes h_k with them and the suffix starts from
    them. The prefix holds no trainable weight (it lies below the lowest trained layer), so none
    is needed. The cache keeps h_k at `cache_dtype` (`PrefixCache`). Returns None when the
    prefix cannot be cached
    (`models.prefix.trained_start_layer`).
    """
    from models import prefix as prefix_lib
    from tffl.engine.feature_cache import stochastic_layers
    from tffl.engine.model_spec import graph_building

    # Configs and positions only; no eager model before TFF's.
    with tf.Graph().as_default(), graph_building():
        full = full_model_fn()
        start = prefix_lib.trained_start_layer(full, stochastic_layers)
        if start is None:
            return None
        spec = prefix_lib.SuffixSpec.from_backbone(prefix_lib.find_backbone(full), start,
                                                   pooling=layout.pooling, head=layout.head)

        def suffix_fn():
            return spec.build_classifier(layout.lora_config, layout.num_classes,
                                         dropout=layout.head_dropout, seed=layout.seed)

        _, non_trainable_positions = prefix_lib.matching_positions(full, suffix_fn())

    def non_trainable():
        values = full_non_trainable()
        return [values[p] for p in non_trainable_positions]

    def prefix_model():
        values = full_non_trainable()  # may build models in a graph: first
        model = full_model_fn()
        for variable, value in zip(model.non_trainable_variables, values, strict=True):
            variable.assign(value)
        return prefix_lib.build_prefix_model(prefix_lib.find_backbone(model), start)

    input_spec = (collections.OrderedDict(sorted(spec.input_spec().items())), label_spec)
    return CachedClassifier(start, suffix_fn, input_spec, non_trainable,
                            PrefixCache(prefix_model, dtype=cache_dtype))
