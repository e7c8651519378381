"""The federated model: a role-tagged Keras model split into federated and base weights.

`ModelSource` is a Keras model as an algorithm takes it (its function, the clients' input spec,
its loss and starting weights). `build_federated_model` draws the model's initial weights once,
keeps the federated part (the variables an algorithm trains and aggregates) as the server's
initial state and writes the base part (frozen backbone, never-trained variables, initial
personal values) to its fingerprinted file (`tffl.engine.frozen`), which every client
computation restores.

>>> source = ModelSource(model_fn, input_spec)
>>> model = build_federated_model(source, federated=spec.indices(["lora_b", "head"]))
>>> [v.shape for v in model.initial_global.trainable]       # B (2×8) and the head (8×3, 3)
[(2, 8), (8, 3), (3,)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import frozen as frozen_lib
from tffl.engine import model_spec
from tffl.engine.client_hooks import ClientHook
from tffl.engine.personal_state import NO_PERSONAL_STATE, PersonalSpec


def _default_loss() -> tf.keras.losses.Loss:
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A Keras model as an algorithm takes it.

    Attributes:
      model_fn: no-arg function returning a fresh, uncompiled Keras model whose variables carry
        `tffl.engine.roles`.
      input_spec: element spec `(x, y)` (or `{"x", "y"}`) of a client's batched dataset.
      loss_fn: no-arg function returning the batch loss `(y_true, y_pred) -> scalar` (default:
        sparse categorical cross-entropy on logits).
      initial_trainable: values of `model.trainable_variables` to start from (e.g. a given LoRA
        A that FFA-LoRA keeps fixed); default the model's own initializers.
      initial_non_trainable: likewise for `model.non_trainable_variables` (e.g. a pretrained
        backbone).
      frozen_dir: where the frozen-weights file goes (`tffl.engine.frozen.default_directory()`).
      client_device: a TensorFlow device for each client's model and loop, e.g. "/GPU:0".
    """

    model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    loss_fn: Callable[[], Any] | None = None
    initial_trainable: Any = None
    initial_non_trainable: Any = None
    frozen_dir: Any = None
    client_device: str | None = None

    def spec(self) -> model_spec.ModelSpec:
        """The model's variables, roles and shapes (`model_spec.inspect_model`)."""
        return model_spec.inspect_model(self.model_fn, self.input_spec)


@dataclasses.dataclass(frozen=True)
class FederatedModel:
    """A role-tagged Keras model split into federated and base weights (`tffl.engine.frozen`)."""

    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    layout: frozen_lib.Layout
    frozen: frozen_lib.FrozenWeights
    initial_global: tff.learning.models.ModelWeights  # numpy
    initial_personal: tuple[np.ndarray, ...]
    loss_fn: Callable[[], Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]
    client_device: str | None = None

    @property
    def spec(self) -> model_spec.ModelSpec:
        return self.layout.spec

    def data_type(self) -> tff.Type:
        """One client's data: a sequence of the input spec's batches."""
        return tff.SequenceType(model_spec.element_type(self.input_spec))

    def initial_weights(self) -> tff.Computation:
        """`() -> w⁰`, the federated weights' initial values (a TF computation)."""
        initial = self.initial_global

        @tff.tensorflow.computation
        def initial_weights():
            return tff.learning.models.ModelWeights(
                trainable=[tf.constant(v) for v in initial.trainable],
                non_trainable=[tf.constant(v) for v in initial.non_trainable])

        return initial_weights

    def full_weights(self, global_weights, personal=None, base_by_reference: bool = False
                     ) -> tff.learning.models.ModelWeights:
        """The whole model's weights (numpy) from the federated ones (+ a personal state). With
        `base_by_reference`, the base values are `tffl.engine.frozen.FrozenValue`s, read from
        the file where they are used (`frozen.assign_weights` assigns them once per model)."""
        global_weights = tff.learning.models.ModelWeights(
            trainable=list(global_weights.trainable),
            non_trainable=list(global_weights.non_trainable))
        base = self.frozen.values() if base_by_reference else self.frozen.load()
        weights = self.layout.assemble(global_weights, base, personal)

        def value(v):
            return v if isinstance(v, frozen_lib.FrozenValue) else np.asarray(v)

        return tff.learning.models.ModelWeights(
            trainable=[value(v) for v in weights.trainable],
            non_trainable=[value(v) for v in weights.non_trainable])

    def check_global_weights(self, weights) -> None:
        """ValueError naming the variable if federated `weights` (`ModelWeights`) do not fit
        this model (e.g. LoRA factors of another rank)."""
        infos = ([self.spec.trainable[k] for k in self.layout.trainable],
                 [self.spec.non_trainable[k] for k in self.layout.non_trainable])
        check_infos(infos, (weights.trainable, weights.non_trainable), "set_model_weights")

    def global_from_full(self, weights) -> tff.learning.models.ModelWeights:
        """The federated part of the whole-model `weights` (`ModelWeights`).

        Raises:
          ValueError: a shape differs from the model's, or a value of a variable the algorithm
            does not federate (frozen, never trained, or personal) differs from the frozen
            weights: those live in the frozen-weights file and personal states, not in the state
            (build the process with `initial_non_trainable=` instead).
        """
        check_weights_shapes(self.spec, weights)
        given = self.layout.base_values(weights.trainable, weights.non_trainable)
        for info, value, kept in zip(self.layout.base_infos(), given, self.frozen.load(),
                                     strict=True):
            if not np.array_equal(value, kept):
                raise ValueError(
                    f"with_model_weights: {info.name} (role {info.role}) is not federated here, "
                    "so the state cannot hold another value for it; it comes from the frozen "
                    f"weights {self.frozen.fingerprint} (or a client's personal state). Build "
                    "the process with initial_non_trainable= to start from other frozen weights.")
        return self.layout.global_values(weights.trainable, weights.non_trainable)


def check_infos(infos, groups, what: str) -> None:
    """ValueError naming the variable, its role and both shapes unless `groups` (trainable,
    non-trainable values) match `infos` (the variables' `VariableInfo`s) in count and shape."""
    from tffl.engine import roles

    for kind, group_infos, values in zip(("trainable", "non_trainable"), infos, groups):
        values = list(values)
        if len(values) != len(group_infos):
            raise ValueError(f"{what}: the model has {len(group_infos)} {kind} variables here, "
                             f"got {len(values)} values")
        for info, value in zip(group_infos, values):
            shape = tuple(np.shape(value))
            if shape != info.shape:
                raise ValueError(
                    f"{what}: {kind} variable {info.name} (role {info.role}) has shape "
                    f"{info.shape} in this process's model, got a value of shape {shape}"
                    + (" (LoRA factors of another rank?)"
                       if info.role in (roles.LORA_A, roles.LORA_B) else ""))


def check_weights_shapes(spec, weights) -> None:
    """Checks whole-model `weights` (`ModelWeights` or `(trainable, non_trainable)`) against
    `spec`, naming the variable, its role and both shapes."""
    groups = ((weights.trainable, weights.non_trainable)
              if isinstance(weights, tff.learning.models.ModelWeights) else tuple(weights))
    check_infos((spec.trainable, spec.non_trainable), groups, "set_model_weights")


def build_federated_model(source: ModelSource, federated: Sequence[int],
                          federated_non_trainable: Sequence[int] = (),
                          personal: Sequence[int] = (),
                          spec: model_spec.ModelSpec | None = None) -> FederatedModel:
    """Draws `source`'s initial weights once (its own initializers, or its `initial_*` values),
    writes the base part to its fingerprinted file.

    Args:
      source: the Keras model and its starting weights.
      federated / federated_non_trainable / personal: positions (`tffl.engine.frozen.Layout`).
      spec: `source.spec()`, when the caller has it already.

    Raises:
      ValueError: `initial_non_trainable` or `initial_trainable` does not fit the model.
    """
    spec = spec or source.spec()
    layout = frozen_lib.Layout.from_spec(spec, federated, federated_non_trainable, personal)
    # Only what `source` does not give is drawn (a pretrained model's frozen part is not).
    trainable, non_trainable = frozen_lib.initial_values(
        source.model_fn, source.input_spec, draw_trainable=source.initial_trainable is None,
        draw_non_trainable=source.initial_non_trainable is None)

    def replaced(values, infos, kind):
        given = [np.asarray(v) for v in values]
        expected = [v.shape for v in infos]
        if [v.shape for v in given] != expected:
            raise ValueError(f"initial weights do not fit the model: {len(given)} {kind} tensors "
                             f"{[v.shape for v in given][:3]}..., the model has {len(expected)} "
                             f"{expected[:3]}...")
        return [v.astype(info.dtype, copy=False) for v, info in zip(given, infos)]

    if source.initial_non_trainable is not None:
        non_trainable = replaced(source.initial_non_trainable, spec.non_trainable, "frozen")
    if source.initial_trainable is not None:
        trainable = replaced(source.initial_trainable, spec.trainable, "trainable")
    return FederatedModel(
        keras_model_fn=source.model_fn, input_spec=source.input_spec, layout=layout,
        frozen=frozen_lib.FrozenWeights.write(layout.base_values(trainable, non_trainable),
                                              source.frozen_dir),
        initial_global=layout.global_values(trainable, non_trainable),
        initial_personal=tuple(trainable[k] for k in layout.personal),
        loss_fn=source.loss_fn or _default_loss, client_device=source.client_device)


def personal_spec(model: FederatedModel, hook: ClientHook | None = None) -> PersonalSpec:
    """One client's personal state on a Keras model: its personal variables (initially the
    model's, the same for every client) and the hook's zero-initialized extra tensors;
    `NO_PERSONAL_STATE` when there are neither."""
    spec = model.spec
    infos = [spec.trainable[k] for k in model.layout.personal]
    extra = list(hook.extra_types if hook else ())
    if not infos and not extra:
        return NO_PERSONAL_STATE
    initial = [np.asarray(v) for v in model.initial_personal] + [
        np.zeros(t.shape, np.dtype(getattr(t.dtype, "as_numpy_dtype", t.dtype)))
        for t in extra]

    def initialize(client_id):
        del client_id
        return [v.copy() for v in initial]

    return PersonalSpec(
        names=tuple(i.name for i in infos) + tuple(f"extra state {k}" for k in range(len(extra))),
        shapes=tuple(v.shape for v in initial), dtypes=tuple(v.dtype for v in initial),
        initial=initialize)
