"""The one client training loop: an optimizer step on the variables of given roles, phase by phase.

Every algorithm (the LoRA ones in `tffl.lora_fl`, the personalized ones in `tffl.personalized`)
runs the same loop, `build_phased_loop`; only the phases (which roles, how many epochs) differ.
For a client with batches (x_1, y_1), …, (x_K, y_K) (one pass over its dataset; the caller limits
it with `.take(K)`), a phase that trains the set S for E epochs runs E passes of

    θ_S ← θ_S − η · ∇_{θ_S} ℓ(y_k, f(x_k; θ))      k = 1..K,  S = variables whose role is trained

every other variable stays at its current value. The loop returns the final trainable values, and
over the last phase the sum of n_k·ℓ_k (ℓ_k the batch loss *before* step k, n_k the batch size),
the number of correct argmax predictions and Σ n_k.

Also here: `inspect_model`, which reads a model's variables (shapes, dtypes, roles) once, in a
throw-away graph, so that TFF types can be built without creating an eager Keras model.

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

from tffl import feature_cache
from tffl import roles
from tffl import runtime as _runtime  # noqa: F401  (its exit hook stops every TFF worker)

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class VariableInfo:
    """One model variable: `name`, `shape` (tuple of ints), numpy `dtype` and `role`."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    role: str


@dataclasses.dataclass(frozen=True)
class LinkInfo:
    """A `tffl.roles.link_lora` link by position: `trainable[a_index]` = A (d_in, r),
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
    every process in `tffl.lora_fl`.
    """

    trainable: tuple[VariableInfo, ...]
    non_trainable: tuple[VariableInfo, ...]
    # The LoRA factors that declared their base kernel (`tffl.roles.link_lora`), in A order.
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


def placed(device: str | None):
    """`tf.device(device)`, or no placement for `None`: where client computations put their ops.

    E.g. "/GPU:0" pins a client's model and training loop to the first GPU TensorFlow sees; TFF's
    C++ worker runs graphs with soft placement, so a device it does not have falls back to CPU.
    """
    return tf.device(device) if device else contextlib.nullcontext()


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
    with _graph_compile_without_jit():
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
    and the `tffl.roles.link_lora` links of its trainable `lora_a` variables (by position).

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


def as_optimizer(learning_rate) -> tff.learning.optimizers.Optimizer:
    """`learning_rate` if it is a `tff.learning.optimizers.Optimizer`, else plain SGD with
    that step (θ ← θ − η·g, `tff.learning.optimizers.build_sgdm(η)`).

    Raises:
      ValueError: a step that is not a finite number > 0.
    """
    if isinstance(learning_rate, tff.learning.optimizers.Optimizer):
        return learning_rate
    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning rate {learning_rate} must be a finite number > 0")
    return tff.learning.optimizers.build_sgdm(learning_rate=float(learning_rate))


@dataclasses.dataclass(frozen=True)
class Phase:
    """One local phase: `epochs` passes over the client's dataset training the variables at
    positions `train_indices` of `model.trainable_variables` (all others stay fixed)."""

    train_indices: tuple[int, ...]
    epochs: int = 1
    # An extra term of this phase's objective, `penalty(features) -> scalar`, added to the batch
    # loss ℓ; `features` are the activations `features_model` returns beside the predictions
    # (e.g. FLUTE's λ1·mean‖ψ(x)‖² + λ2‖H‖² + λ3·NC(H), which closes over the head variable).
    penalty: Callable[[tf.Tensor], tf.Tensor] | None = None
    # This phase's coupled L2 λ_p (g + λ_p·θ), instead of the loop's `weight_decay` (e.g.
    # AdaptPFL's shortcut ridge β).
    weight_decay: float | None = None
    # `after(variables, start)`, run once the phase's epochs are done: `variables` are
    # `model.trainable_variables`, `start` their values when the loop began (e.g. AdaptPFL's
    # projection of the shortcut and its damping toward the stored personal values).
    after: Callable[[list, list], None] | None = None
    # A phase that trains only the output layer computes the layers below it once per batch and
    # runs its epochs on those features (`tffl.feature_cache`); False runs the whole model in
    # every epoch.
    cache_features: bool = True


def build_phased_loop(
    model: tf.keras.Model,
    loss_fn: LossFn,
    learning_rate: float | tff.learning.optimizers.Optimizer,
    phases: Sequence[Phase],
    features_model: tf.keras.Model | None = None,
    device: str | None = None,
    weight_decay: float = 0.0,
    jit_compile: bool = False,
) -> Callable:
    """The one client training loop: assign the given weights, then SGD phase by phase.

    For phase p with trained set S_p and E_p epochs, for each of the E_p passes over the
    dataset's batches (x_k, y_k), with g_k = ∇_{θ_{S_p}} ℓ(y_k, f(x_k; θ)) + λ·θ_{S_p}
    (λ = `weight_decay`, coupled L2 as in PyTorch's SGD/Adam `weight_decay`):

        θ_{S_p} ← optimizer step of θ_{S_p} with gradient g_k   (SGD: θ_{S_p} − η·g_k)

    (λ is the phase's own `Phase.weight_decay` when it has one); after its epochs the phase's
    `after(variables, start)`, if any, may transform the variables. A phase that trains only the
    output layer h of f = h∘ψ (a deterministic ψ) passes the dataset once to compute ψ(x_k), then
    runs its E passes on the head alone (`tffl.feature_cache`): the same steps, ψ run once.

    The optimizer (a `tff.learning.optimizers.Optimizer`; a float η means plain SGD) starts
    from a fresh state in every phase, e.g. momentum restarts at 0.

    e.g. FedRep's head phase then representation phase (the second sees the first's head), or a
    single phase for FedAvg-style joint training.

    The loop over batches iterates `iter(dataset)`, which AutoGraph turns into a `tf.while_loop`
    in the function's own graph. (A loop over the dataset itself becomes a `dataset.reduce`,
    whose body runs as a tf.data function: op by op, without inter-op parallelism, and
    instantiated per call; on a small BERT it was 1.7x slower per step; docs/PERFORMANCE.md.)

    Args:
      model: the client's Keras model (built).
      loss_fn: `(y_true, y_pred) -> scalar` batch loss ℓ (e.g. a `tf.keras.losses.Loss`).
      learning_rate: η > 0 (plain SGD), or a `tff.learning.optimizers.Optimizer` (e.g.
        `build_sgdm(η, momentum=0.9)`, `build_adam(η)`).
      phases: the phases, run in order; each trains at least one variable, epochs ≥ 1.
      features_model: a model sharing `model`'s layers that returns `[features, predictions]`;
        needed when a phase has a `penalty`, whose steps then minimize ℓ + penalty(features).
      device: a TensorFlow device for the loop's ops (`placed`); build `model` under the same
        `placed(device)` to keep its variables there too.
      weight_decay: λ ≥ 0 added to the gradient as λ·θ.
      jit_compile: make each phase's step (forward, gradient, optimizer update) a
        `tf.function(jit_compile=True)` called inside the loop (the dataset loop itself cannot
        be compiled). Eagerly or in a `tf.function` in Python, XLA compiles it; TFF 0.87's
        `worker_binary` has no XLA and runs it uncompiled (docs/PERFORMANCE.md, "XLA").

    Returns:
      A `tf.function` `(weights: ModelWeights, dataset) -> dict` with `trainable` (the final
      values of all `model.trainable_variables`), and over the batches of the *last* phase:
      `loss_sum` = Σ_k n_k·ℓ_k (ℓ_k the batch data loss before step k, without any penalty),
      `num_correct` = number of
      examples whose argmax prediction equals an integer label (0 unless the model outputs
      [batch, classes] scores for integer labels), `num_examples` = Σ_k n_k (all float32).
    """
    trainable = model.trainable_variables
    non_trainable = model.non_trainable_variables
    optimizer = as_optimizer(learning_rate)
    if not (np.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay={weight_decay} must be a finite number >= 0")
    for phase in phases:
        if not phase.train_indices:
            raise ValueError("a training phase must train at least one variable")
        if phase.epochs < 1:
            raise ValueError(f"a training phase needs epochs >= 1, got {phase.epochs}")
        if phase.penalty is not None and features_model is None:
            raise ValueError("a phase with a penalty needs features_model")
        if phase.weight_decay is not None and not (
                np.isfinite(phase.weight_decay) and phase.weight_decay >= 0):
            raise ValueError(f"a phase's weight_decay={phase.weight_decay} must be a finite "
                             "number >= 0")

    def correct(y, pred):
        if not (y.dtype.is_integer and pred.shape.rank == 2 and (pred.shape[-1] or 0) > 1):
            return tf.constant(0.0, tf.float32)
        labels = tf.cast(tf.reshape(y, [-1]), tf.int64)
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(pred, -1), labels), tf.float32))

    def split(phase: Phase):
        """`(body, head)` when the phase runs on cached features (`tffl.feature_cache`)."""
        if not (phase.cache_features and phase.epochs > 1):
            return None
        found = feature_cache.head_split(model, [trainable[i] for i in phase.train_indices])
        if found is not None and phase.penalty is not None and not _same_features(
                features_model, found[0]):
            return None
        return found

    def make_step(phase: Phase, head=None):
        """One SGD step of `phase` on a batch: `(x, y, optimizer state) -> (optimizer state,
        batch loss, batch size, correct predictions)`, XLA-compiled with `jit_compile`; with
        `head`, x is the batch's features and the step runs the head alone."""
        trained = [trainable[i] for i in phase.train_indices]

        def step(x, y, opt_state):
            with tf.GradientTape() as tape:
                if head is not None:
                    features, pred = x, head(x, training=True)
                elif phase.penalty is None:
                    features, pred = None, model(x, training=True)
                else:
                    features, pred = features_model(x, training=True)
                loss = loss_fn(y, pred)
                objective = loss
                if phase.penalty is not None:
                    objective = loss + tf.cast(phase.penalty(features), loss.dtype)
            grads = tape.gradient(objective, trained,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            values = [v.read_value() for v in trained]
            decay = weight_decay if phase.weight_decay is None else phase.weight_decay
            if decay:
                grads = [g + tf.cast(decay, g.dtype) * w for g, w in zip(grads, values)]
            opt_state, values = optimizer.next(opt_state, values, grads)
            for variable, value in zip(trained, values):
                variable.assign(value)
            n = tf.cast(tf.shape(tf.nest.flatten(y)[0])[0], tf.float32)
            return opt_state, tf.cast(loss, tf.float32), n, correct(y, pred)

        return tf.function(step, jit_compile=True) if jit_compile else step

    splits = [split(phase) for phase in phases]
    steps = [make_step(phase, None if found is None else found[1])
             for phase, found in zip(phases, splits)]

    @tf.function
    def loop(weights, dataset):
        with placed(device):
            return run(weights, dataset)

    def run(weights, dataset):
        for variable, value in zip(trainable, weights.trainable, strict=True):
            variable.assign(value)
        for variable, value in zip(non_trainable, weights.non_trainable, strict=True):
            variable.assign(value)
        zero = tf.constant(0.0, tf.float32)
        totals = (zero, zero, zero)  # loss_sum, num_correct, num_examples of the last phase
        for p, phase in enumerate(phases):
            trained = [trainable[i] for i in phase.train_indices]
            last = p == len(phases) - 1
            opt_state = optimizer.initialize(
                [tf.TensorSpec(v.shape, v.dtype) for v in trained])
            if splits[p] is None:
                data = dataset.repeat(phase.epochs) if phase.epochs > 1 else dataset
                for batch in iter(data):  # a tf.while_loop; see `build_phased_loop`
                    x, y = split_batch(batch)
                    opt_state, loss, n, batch_correct = steps[p](x, y, opt_state)
                    if last:
                        totals = _tally(totals, loss, n, batch_correct)
            else:  # ψ(x_k) once, then E passes of head steps (`tffl.feature_cache`)
                pairs = dataset.map(_as_pair)
                arrays, size = feature_cache.cache(splits[p][0], pairs)
                for _ in tf.range(phase.epochs):
                    for k in tf.range(size):
                        x, y = feature_cache.read(arrays, pairs.element_spec[1], k)
                        opt_state, loss, n, batch_correct = steps[p](x, y, opt_state)
                        if last:
                            totals = _tally(totals, loss, n, batch_correct)
            if phase.after is not None:
                phase.after(trainable, weights.trainable)
        loss_sum, num_correct, num_examples = totals
        return dict(
            trainable=[v.read_value() for v in trainable],
            loss_sum=loss_sum,
            num_correct=num_correct,
            num_examples=num_examples,
        )

    return loop


def _tally(totals, loss, n, correct):
    """`(loss_sum, num_correct, num_examples)` after one more batch of `n` examples."""
    loss_sum, num_correct, num_examples = totals
    return loss_sum + loss * n, num_correct + correct, num_examples + n


def _as_pair(*batch):
    """`dataset.map` function: a batch (tuple or mapping) -> `(x, y)`."""
    return split_batch(batch[0] if len(batch) == 1 else batch)


def _same_features(features_model: tf.keras.Model | None, body: tf.keras.Model) -> bool:
    """Whether `features_model`'s features (its first output) are `body`'s output."""
    return features_model is not None and features_model.outputs[0] is body.outputs[0]


def build_training_loop(
    model: tf.keras.Model,
    loss_fn: LossFn,
    learning_rate: float,
    train_indices: Sequence[int],
    device: str | None = None,
) -> Callable:
    """One phase of `build_phased_loop`: one pass of SGD on `trainable[train_indices]`.

    Returns:
      A `tf.function` `(weights: ModelWeights, dataset) -> (new_values, loss_sum, num_examples)`
      where `new_values` is the list of the trained variables' final values (in `train_indices`
      order), `loss_sum` = Σ_k n_k·ℓ_k (float32) and `num_examples` = Σ_k n_k (float32).
    """
    phased = build_phased_loop(model, loss_fn, learning_rate, [Phase(tuple(train_indices), 1)],
                               device=device)

    def loop(weights, dataset):
        out = phased(weights, dataset)
        return ([out["trainable"][i] for i in train_indices], out["loss_sum"],
                out["num_examples"])

    return loop
