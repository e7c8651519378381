"""What stays on the clients' side of the wire: the model's layout into federated and base weights,
and the base (frozen) weights as a fingerprinted checkpoint file read inside client computations.

A model's variables split in two (`Layout`):

- the *federated* variables: what an algorithm trains and aggregates (LoRA factors, aggregated
  heads or layers), plus what its server step rewrites (FLoRA's base kernels). They are the
  `global_model_weights` of the server state, what is broadcast, and what checkpoints hold:
  `ModelWeights(trainable=[θ_k for k in layout.trainable], non_trainable=[ν_j for j in
  layout.non_trainable])`.
- the *base* variables: everything else (the frozen backbone, never-trained layers, the initial
  values of personal heads). They never travel: `FrozenWeights` writes their values once to a
  TensorFlow checkpoint (`RestoreV2`/`SaveV2` format) named by its content fingerprint, and every
  client computation restores them from that file (the graph carries only the path). A client's
  full model is `Layout.assemble(global weights, restored base, personal state)`.

The file must be readable by every TFF worker: on one machine the default folder
(`$TFFL_CACHE/frozen`, default `~/.cache/tffl/frozen`) is; remote workers need it on a shared
filesystem (`frozen_dir=`). The fingerprint (SHA-256 over names, shapes, dtypes and bytes) goes into
checkpoints, so a run cannot be resumed against other frozen weights.

Example:

>>> layout = Layout.from_spec(spec, trainable=spec.indices([roles.LORA_A, roles.LORA_B]))
>>> values = initial_values(model_fn, input_spec)        # (trainable, non_trainable) numpy
>>> frozen = FrozenWeights.write(layout.base_values(*values), run_dir / "frozen")
>>> len(frozen.fingerprint)
16
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import model_spec

_INDEX_SUFFIX = ".index"


def default_directory() -> pathlib.Path:
    """`$TFFL_FROZEN_DIR`, else `$TFFL_CACHE/frozen`, else `~/.cache/tffl/frozen`."""
    if os.environ.get("TFFL_FROZEN_DIR"):
        return pathlib.Path(os.environ["TFFL_FROZEN_DIR"])
    cache = os.environ.get("TFFL_CACHE") or pathlib.Path.home() / ".cache" / "tffl"
    return pathlib.Path(cache) / "frozen"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which variables of a `model_spec.ModelSpec` are federated; the rest are base.

    Attributes:
      spec: the model's variables.
      trainable: positions in `spec.trainable` of the federated trainable variables, ascending.
      non_trainable: positions in `spec.non_trainable` of federated non-trainable variables
        (FLoRA's merged base kernels), ascending.
      personal: positions in `spec.trainable` carried as each client's personal state.
    """

    spec: model_spec.ModelSpec
    trainable: tuple[int, ...]
    non_trainable: tuple[int, ...] = ()
    personal: tuple[int, ...] = ()

    @classmethod
    def from_spec(cls, spec, trainable, non_trainable=(), personal=()) -> "Layout":
        trainable, non_trainable = tuple(sorted(set(trainable))), tuple(sorted(set(non_trainable)))
        personal = tuple(sorted(set(personal)))
        if set(trainable) & set(personal):
            raise ValueError("a variable cannot be both federated and personal: "
                             f"{[spec.trainable[k].name for k in set(trainable) & set(personal)]}")
        return cls(spec, trainable, non_trainable, personal)

    @property
    def base_trainable(self) -> tuple[int, ...]:
        return tuple(k for k in range(len(self.spec.trainable)) if k not in self.trainable)

    @property
    def base_non_trainable(self) -> tuple[int, ...]:
        return tuple(k for k in range(len(self.spec.non_trainable))
                     if k not in self.non_trainable)

    def base_infos(self) -> list[model_spec.VariableInfo]:
        return ([self.spec.trainable[k] for k in self.base_trainable]
                + [self.spec.non_trainable[k] for k in self.base_non_trainable])

    def global_index(self, k: int) -> int:
        """Position in `global_model_weights.trainable` of `spec.trainable[k]`."""
        return self.trainable.index(k)

    def global_type(self) -> tff.Type:
        """TFF type of the federated `ModelWeights` (the broadcast and the server's model)."""

        def tensors(infos, positions):
            return [tff.TensorType(infos[k].dtype, infos[k].shape) for k in positions]

        return tff.types.to_type(tff.learning.models.ModelWeights(
            trainable=tensors(self.spec.trainable, self.trainable),
            non_trainable=tensors(self.spec.non_trainable, self.non_trainable)))

    def base_values(self, trainable: Sequence, non_trainable: Sequence) -> list[np.ndarray]:
        """The base variables' values (base trainable, then base non-trainable), from the full
        value lists."""
        return ([np.asarray(trainable[k]) for k in self.base_trainable]
                + [np.asarray(non_trainable[k]) for k in self.base_non_trainable])

    def global_values(self, trainable: Sequence, non_trainable: Sequence
                      ) -> tff.learning.models.ModelWeights:
        """The federated part of full value lists, as `ModelWeights`."""
        return tff.learning.models.ModelWeights(
            trainable=[np.asarray(trainable[k]) for k in self.trainable],
            non_trainable=[np.asarray(non_trainable[k]) for k in self.non_trainable])

    def assemble(self, global_weights, base: Sequence, personal: Sequence | None = None
                 ) -> tff.learning.models.ModelWeights:
        """The full `ModelWeights` (model order) from the federated part, the base values (as
        `base_values` orders them) and, if given, the personal values (in `self.personal`
        order, overriding the base's initial values). Works on tensors and on numpy arrays."""
        num_t, num_n = len(self.spec.trainable), len(self.spec.non_trainable)
        trainable, non_trainable = [None] * num_t, [None] * num_n
        base = list(base)
        for k, value in zip(self.base_trainable, base[: len(self.base_trainable)], strict=True):
            trainable[k] = value
        for k, value in zip(self.base_non_trainable, base[len(self.base_trainable):],
                            strict=True):
            non_trainable[k] = value
        for k, value in zip(self.trainable, global_weights.trainable, strict=True):
            trainable[k] = value
        for k, value in zip(self.non_trainable, global_weights.non_trainable, strict=True):
            non_trainable[k] = value
        if personal is not None:
            for k, value in zip(self.personal, list(personal)[: len(self.personal)],
                                strict=True):
                trainable[k] = value
        return tff.learning.models.ModelWeights(trainable=trainable, non_trainable=non_trainable)


def fingerprint(values: Sequence[np.ndarray]) -> str:
    """First 16 hex digits of SHA-256 over every value's shape, dtype and bytes, in order."""
    digest = hashlib.sha256()
    for value in values:
        value = np.ascontiguousarray(value)
        digest.update(f"{value.shape}|{value.dtype.str}|".encode())
        digest.update(value.reshape(-1).view(np.uint8))   # the bytes, without a copy
    return digest.hexdigest()[:16]


def _names(count: int) -> list[str]:
    return [f"base_{k:05d}" for k in range(count)]


@dataclasses.dataclass(frozen=True)
class FrozenWeights:
    """Base weights in a checkpoint file: `prefix` (the file path without `.index`/`.data-*`),
    their `shapes` and numpy `dtypes`, and the content `fingerprint`."""

    prefix: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    fingerprint: str

    @classmethod
    def write(cls, values: Sequence[np.ndarray], directory: os.PathLike | str | None = None
              ) -> "FrozenWeights":
        """Writes `values` (once: the folder is named by their fingerprint, and an existing
        complete one is reused) under `directory` (default `default_directory()`)."""
        values = [np.asarray(v) for v in values]
        digest = fingerprint(values)
        folder = pathlib.Path(directory or default_directory()) / digest
        prefix = folder / "weights"
        frozen = cls(str(prefix), tuple(tuple(v.shape) for v in values),
                     tuple(v.dtype for v in values), digest)
        if not values or pathlib.Path(str(prefix) + _INDEX_SUFFIX).is_file():
            return frozen
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{digest}_", dir=folder.parent))
        try:
            # One bundle per value, then one checkpoint of them all: a value becomes a tensor
            # only while it is written (all at once, the base would be held twice).
            parts = [str(tmp / f"part_{k:05d}") for k in range(len(values))]
            for part, name, value in zip(parts, _names(len(values)), values):
                tf.raw_ops.SaveV2(prefix=part, tensor_names=[name], shape_and_slices=[""],
                                  tensors=[tf.convert_to_tensor(value)])
            tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts,
                                          destination_prefix=str(tmp / "weights"),
                                          delete_old_dirs=False)
            os.chmod(tmp, 0o755)  # readable by workers running as other users
            try:
                os.replace(tmp, folder)
            except OSError:  # another process wrote the same content first
                if not pathlib.Path(str(prefix) + _INDEX_SUFFIX).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return frozen

    def __len__(self) -> int:
        return len(self.shapes)

    def restore(self) -> list[tf.Tensor]:
        """The values as tensors, read from the file by a `RestoreV2` op (inside a graph: the
        file is read each time the graph runs, on the machine that runs it)."""
        if not self.shapes:
            return []
        tensors = tf.raw_ops.RestoreV2(
            prefix=self.prefix, tensor_names=_names(len(self.shapes)),
            shape_and_slices=[""] * len(self.shapes),
            dtypes=[tf.as_dtype(d) for d in self.dtypes])
        return [tf.ensure_shape(t, s) for t, s in zip(tensors, self.shapes)]

    def restore_one(self, k: int) -> tf.Tensor:
        """Value k alone, read from the file (`restore`'s k-th tensor); `FileNotFoundError`
        naming the file when it is gone (`check_readable`)."""
        self.check_readable()
        tensor, = tf.raw_ops.RestoreV2(prefix=self.prefix, tensor_names=[_names(k + 1)[k]],
                                       shape_and_slices=[""],
                                       dtypes=[tf.as_dtype(self.dtypes[k])])
        return tf.ensure_shape(tensor, self.shapes[k])

    def load(self) -> list[np.ndarray]:
        """The values as numpy arrays (eagerly), read one at a time, so that the base is held
        about once, not twice (1.07 GB for Gemma 3 270M)."""
        return [self.restore_one(k).numpy() for k in range(len(self.shapes))]

    def values(self) -> list["FrozenValue"]:
        """Each value as a `FrozenValue`: read from the file only where it is used."""
        return [FrozenValue(self, k) for k in range(len(self.shapes))]

    def check_readable(self) -> None:
        """Raises `FileNotFoundError` naming the file if it is gone (e.g. a cleaned cache)."""
        if self.shapes and not pathlib.Path(self.prefix + _INDEX_SUFFIX).is_file():
            raise FileNotFoundError(
                f"frozen weights {self.prefix}.index are missing (fingerprint {self.fingerprint});"
                " rebuild the process to write them again")


@dataclasses.dataclass(frozen=True)
class FrozenValue:
    """Value `index` of the `FrozenWeights` file `weights`, read when it is used: a variable's
    `assign` (TensorFlow's conversion) and `np.asarray` read this one value from the file, so a
    whole model's weights (`tffl.engine.federated_model.FederatedModel.full_weights(...,
    base_by_reference=True)`) do not hold the base in memory, and a model that holds the value
    already need not read it again (`assign_weights`).

    >>> array = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> value = FrozenWeights.write([array], run_dir / "frozen").values()[0]
    >>> value.shape, np.asarray(value)[1].tolist(), tf.Variable(value).numpy().sum()
    ((2, 3), [3.0, 4.0, 5.0], 15.0)
    """

    weights: FrozenWeights
    index: int

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weights.shapes[self.index]

    @property
    def dtype(self) -> np.dtype:
        return self.weights.dtypes[self.index]

    def __array__(self, dtype=None):
        value = self.weights.restore_one(self.index).numpy()
        return value if dtype is None else value.astype(dtype, copy=False)


def _frozen_value_tensor(value: FrozenValue, dtype=None, name=None, as_ref=False) -> tf.Tensor:
    del name, as_ref
    tensor = value.weights.restore_one(value.index)
    return tensor if dtype is None else tf.cast(tensor, dtype)


tf.register_tensor_conversion_function(FrozenValue, _frozen_value_tensor)

# What each Keras model's variables were last given from a frozen-weights file
# (`assign_weights`): {model: {variable position: FrozenValue}}.
_HELD = weakref.WeakKeyDictionary()


def assign_weights(weights, model: tf.keras.Model) -> None:
    """`weights.assign_weights_to(model)` (a `ModelWeights` of `model`'s weights), except that
    a `FrozenValue` the variable was given last time is not read again: a base assigned once
    stays, and only what changed (the trained weights) is assigned.

    >>> model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
    >>> base = FrozenWeights.write([np.ones((3, 2), np.float32)], run_dir / "frozen").values()
    >>> weights = tff.learning.models.ModelWeights([base[0], np.zeros(2, np.float32)], [])
    >>> assign_weights(weights, model)
    >>> model.layers[0].kernel.numpy().sum(), model.layers[0].bias.numpy().sum()
    (6.0, 0.0)
    """
    held = _HELD.setdefault(model, {})
    variables = list(model.trainable_weights) + list(model.non_trainable_weights)
    values = list(weights.trainable) + list(weights.non_trainable)
    if len(variables) != len(values):
        raise ValueError(f"assign_weights: the model has {len(variables)} weights, got "
                         f"{len(values)} values")
    for k, (variable, value) in enumerate(zip(variables, values)):
        if isinstance(value, FrozenValue) and held.get(k) == value:
            continue
        variable.assign(value)
        if isinstance(value, FrozenValue):
            held[k] = value
        else:
            held.pop(k, None)


def initial_values(keras_model_fn: Callable[[], tf.keras.Model], input_spec,
                   draw_trainable: bool = True, draw_non_trainable: bool = True
                   ) -> tuple[list[np.ndarray] | None, list[np.ndarray] | None]:
    """The model's initial `(trainable, non_trainable)` values, drawn once by its initializers
    in a throw-away graph and session (no eager Keras model is created, see `tffl.algorithms.lora_fl`).

    A part not drawn (`draw_trainable=False` or `draw_non_trainable=False`, for values the caller
    has, e.g. a checkpoint's frozen weights) is None and costs nothing: only the drawn part's
    initializers run. Each variable's draw is its own op's, so the drawn values are the same
    either way."""
    with tf.Graph().as_default() as graph:
        model = model_spec.build_model(keras_model_fn, input_spec)
        trainable, non_trainable = model.trainable_variables, model.non_trainable_variables
        drawn = (trainable if draw_trainable else []) + (non_trainable if draw_non_trainable
                                                         else [])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([v.initializer for v in drawn])
            values = [np.asarray(v) for v in session.run([v.read_value() for v in drawn])]
    count = len(trainable) if draw_trainable else 0
    return (values[:count] if draw_trainable else None,
            values[count:] if draw_non_trainable else None)
