"""What a Keras model's variables are, read without keeping the model: `inspect_model`, `ModelSpec`.

`inspect_model` builds the model once in a throw-away graph and records its variables (shapes,
dtypes, `tffl.engine.roles` roles and `tffl.engine.roles.link_lora` links) as a `ModelSpec`, so that TFF types
(`ModelSpec.weights_type`, `element_type`) can be built without creating an eager Keras model.
`build_model` is how every client computation builds the model itself.

Example:

>>> spec = inspect_model(model_fn, input_spec)    # RoLoRA's net, d = 8, r = 2, 3 classes
>>> spec.indices([roles.LORA_B])          # positions in `model.trainable_variables`
(1,)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import roles


@dataclasses.dataclass(frozen=True)
class VariableInfo:
    """One model variable: `name`, `shape` (tuple of ints), numpy `dtype` and `role`."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    role: str


@dataclasses.dataclass(frozen=True)
class LinkInfo:
    """A `tffl.engine.roles.link_lora` link by position: `trainable[a_index]` = A (d_in, r),
    `trainable[b_index]` = B (r, d_out) adapt the frozen kernel W0 at position `base_index` of
    `non_trainable` (or of `trainable` when `base_trainable`), as W0 + `scale`·A·B."""

    a_index: int
    b_index: int
    base_index: int
    base_trainable: bool
    scale: float


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The variables of a Keras model, in `trainable_variables` / `non_trainable_variables` order.

    This is the layout of `tff.learning.models.ModelWeights(trainable, non_trainable)` used by
    every process in `tffl.algorithms.lora_fl`.
    """

    trainable: tuple[VariableInfo, ...]
    non_trainable: tuple[VariableInfo, ...]
    # The LoRA factors that declared their base kernel (`tffl.engine.roles.link_lora`), in A order.
    links: tuple[LinkInfo, ...] = ()

    def indices(self, wanted_roles: Sequence[str]) -> tuple[int, ...]:
        """Positions in `trainable` of the variables whose role is in `wanted_roles`."""
        wanted = set(wanted_roles)
        return tuple(i for i, v in enumerate(self.trainable) if v.role in wanted)

    def weights_type(self) -> tff.Type:
        """TFF type of the model's `ModelWeights` (tensors of fully known shape)."""

        def tensors(infos):
            return [tff.TensorType(v.dtype, v.shape) for v in infos]

        return tff.types.to_type(
            tff.learning.models.ModelWeights(
                trainable=tensors(self.trainable), non_trainable=tensors(self.non_trainable)
            )
        )


def split_batch(batch):
    """`(x, y)` of a batch given as a tuple/list `(x, y)` or a mapping with keys `x` and `y`."""
    if isinstance(batch, Mapping):
        return batch["x"], batch["y"]
    x, y = batch
    return x, y


def element_type(input_spec) -> tff.Type:
    """TFF type of a dataset element described by a structure of `tf.TensorSpec`s.

    Plain dicts become `OrderedDict`s with sorted keys (the order `tf.nest` and `tf.data` use),
    which TFF needs to serialize datasets with named elements.
    """

    def convert(spec):
        if isinstance(spec, tff.Type):
            return spec
        if isinstance(spec, tf.TensorSpec):
            return tff.TensorType(spec.dtype.as_numpy_dtype, spec.shape.as_list())
        if isinstance(spec, dict) and not isinstance(spec, collections.OrderedDict):
            return collections.OrderedDict((k, convert(spec[k])) for k in sorted(spec))
        if isinstance(spec, Mapping):
            return collections.OrderedDict((k, convert(v)) for k, v in spec.items())
        if isinstance(spec, (tuple, list)):
            return type(spec)(convert(v) for v in spec)
        raise TypeError(f"input_spec leaves must be tf.TensorSpec, got {type(spec).__name__}")

    return tff.types.to_type(convert(input_spec))


def _zeros_creator(next_creator, **kwargs):
    """A `tf.variable_creator_scope` creator: a callable initial value of known shape -> zeros."""
    shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
    if (callable(kwargs.get("initial_value")) and shape is not None and dtype is not None
            and tf.TensorShape(shape).is_fully_defined()):
        kwargs["initial_value"] = lambda: tf.zeros(shape, dtype)
    return next_creator(**kwargs)


@contextlib.contextmanager
def _graph_compile_without_jit():
    """Lets models that compile themselves with `jit_compile` (KerasNLP task models such as
    `BertClassifier`) be built in TFF's graphs: Keras 2's graph-mode `Model.compile` rejects the
    argument. The compiled loss and optimizer are never used here (the client loop has its own)."""
    if tf.executing_eagerly():
        yield
        return
    from keras.src.engine import training_v1

    original = training_v1.Model.compile

    def compile_without_jit(self, *args, jit_compile=None, **kwargs):
        del jit_compile
        return original(self, *args, **kwargs)

    training_v1.Model.compile = compile_without_jit
    try:
        yield
    finally:
        training_v1.Model.compile = original


@contextlib.contextmanager
def _graph_constants_without_session():
    """Lets Keras 2 read the constants of a graph-mode functional model without a session.

    Building a functional model in a graph (as TFF does), Keras wraps each TensorFlow op applied
    to its symbolic tensors (KerasNLP's backbones apply many) in a `TensorFlowOpLayer`, and
    reads that op's other inputs, constants, with `keras.backend.function([], constant)([])`: a
    run of Keras's session, which first runs the initializers of every variable of the graph not
    yet initialized there, i.e. draws the whole model's random initial values, only to throw
    them away (half of a MiniLM classifier's build, 3-6 s of a 2-core machine). Within this
    scope a `Const` op's value is read from the op itself, as the session returns it (a numpy
    array, a numpy scalar or bytes for a scalar); any other tensor goes through the session as
    before. The model and every value drawn from it are the same."""
    if tf.executing_eagerly():
        yield
        return
    from keras.src import backend

    original = backend.function

    def function(inputs, outputs, *args, **kwargs):
        if (not inputs and not args and not kwargs and isinstance(outputs, tf.Tensor)
                and outputs.op.type == "Const"):
            value = tf.get_static_value(outputs)
            return lambda _: value[()] if value.ndim == 0 else value
        return original(inputs, outputs, *args, **kwargs)

    backend.function = function
    try:
        yield
    finally:
        backend.function = original


@contextlib.contextmanager
def graph_building():
    """The scope in which `build_model` calls a model function: in a graph (TFF's, or a throw-away
    one), Keras 2 builds the model without `jit_compile` (`_graph_compile_without_jit`) and
    reads its constants without a session (`_graph_constants_without_session`); eagerly it
    changes nothing. For any code that builds a Keras model in a graph."""
    with _graph_compile_without_jit(), _graph_constants_without_session():
        yield


def build_model(keras_model_fn: Callable[[], tf.keras.Model], input_spec,
                zero_init: bool = False) -> tf.keras.Model:
    """Calls `keras_model_fn()` and makes sure its variables exist (calls it on zeros if needed).

    `zero_init=True` gives every variable of known shape a zero initializer instead of the
    model's own (e.g. random) one. Client computations use it: they assign every variable from
    the broadcast weights before reading it, and TFF runs a computation's initializers on every
    call, so a random initializer would draw a whole random model per client per round (for a
    MiniLM-sized backbone, ~23M random numbers) only to overwrite it.
    """
    if zero_init:
        with tf.variable_creator_scope(_zeros_creator):
            return build_model(keras_model_fn, input_spec)
    with graph_building():
        model = keras_model_fn()
    if not isinstance(model, tf.keras.Model):
        raise TypeError(f"keras_model_fn must return a tf.keras.Model, got {type(model).__name__}")
    if not model.built:
        x_spec, _ = split_batch(input_spec)
        dummy = tf.nest.map_structure(
            lambda s: tf.zeros([1 if d is None else d for d in s.shape], s.dtype), x_spec
        )
        model(dummy, training=False)
    return model


def inspect_model(keras_model_fn: Callable[[], tf.keras.Model], input_spec) -> ModelSpec:
    """Builds the model once in a fresh graph and records its variables' shapes, dtypes, roles,
    and the `tffl.engine.roles.link_lora` links of its trainable `lora_a` variables (by position).

    Raises:
      ValueError: if a variable's shape is not fully known, or a link names a variable that is
        not among the model's (trainable B, any base kernel).
    """

    def info(variable):
        shape = tuple(variable.shape.as_list())
        if any(d is None for d in shape):
            raise ValueError(f"variable {variable.name} has a partly unknown shape {shape}")
        return VariableInfo(variable.name, shape, np.dtype(variable.dtype.as_numpy_dtype),
                            roles.role_of(variable))

    def position(variables, variable):
        return next((k for k, v in enumerate(variables) if v is variable), None)

    with tf.Graph().as_default():
        model = build_model(keras_model_fn, input_spec)
        trainable, non_trainable = model.trainable_variables, model.non_trainable_variables
        links = []
        for a_index, variable in enumerate(trainable):
            link = roles.lora_link(variable)
            if link is None:
                continue
            b_index = position(trainable, link.lora_b)
            base_index = position(non_trainable, link.base_kernel)
            base_trainable = base_index is None
            if base_trainable:
                base_index = position(trainable, link.base_kernel)
            if b_index is None or base_index is None:
                raise ValueError(
                    f"LoRA link of {variable.name}: its B ({link.lora_b.name}) must be a "
                    f"trainable and its base kernel ({link.base_kernel.name}) a variable of the "
                    "model"
                )
            links.append(LinkInfo(a_index, b_index, base_index, base_trainable, link.scale))
        return ModelSpec(
            trainable=tuple(info(v) for v in trainable),
            non_trainable=tuple(info(v) for v in non_trainable),
            links=tuple(links),
        )
