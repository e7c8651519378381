"""The one client training loop: an optimizer step on the variables of given roles, phase by phase.

Every algorithm (the LoRA ones in `tffl.algorithms.lora_fl`, the personalized ones in `tffl.algorithms.personalized`)
runs the same loop, `build_phased_loop`; only the phases (which roles, how many epochs) differ.
For a client with batches (x_1, y_1), …, (x_K, y_K) (one pass over its dataset; the caller limits
it with `.take(K)`), a phase that trains the set S for E epochs runs E passes of

    θ_S ← θ_S − η · ∇_{θ_S} ℓ(y_k, f(x_k; θ))      k = 1..K,  S = variables whose role is trained

every other variable stays at its current value. The loop returns the final trainable values, and
over the last phase the sum of n_k·ℓ_k (ℓ_k the batch loss *before* step k, n_k the batch size),
the number of correct argmax predictions and Σ n_k.

Reading a model's variables (`inspect_model`, `ModelSpec`, `build_model`, `element_type`,
`split_batch`) is `tffl.engine.model_spec`'s job.

Example:

>>> spec = model_spec.inspect_model(model_fn, input_spec)  # RoLoRA's net, d = 8, r = 2, 3 classes
>>> phase = Phase(spec.indices([roles.LORA_B]), epochs=2)   # 2 passes training B only
>>> phase.train_indices, phase.epochs
((1,), 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import feature_cache
from tffl.engine import model_spec

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def placed(device: str | None):
    """`tf.device(device)`, or no placement for `None`: where client computations put their ops.

    E.g. "/GPU:0" pins a client's model and training loop to the first GPU TensorFlow sees; TFF's
    C++ worker runs graphs with soft placement, so a device it does not have falls back to CPU.
    """
    return tf.device(device) if device else contextlib.nullcontext()


def as_optimizer(learning_rate) -> tff.learning.optimizers.Optimizer:
    """`learning_rate` if it is a `tff.learning.optimizers.Optimizer`, else plain SGD with
    that step (θ ← θ − η·g, `tff.learning.optimizers.build_sgdm(η)`).

    Raises:
      ValueError: a step that is not a finite number > 0.
    """
    if isinstance(learning_rate, tff.learning.optimizers.Optimizer):
        return learning_rate
    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"client_optimizer={learning_rate} must be a finite number > 0 (an SGD "
                         "step) or a tff.learning.optimizers.Optimizer")
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
    # runs its epochs on those features (`tffl.engine.feature_cache`); False runs the whole model in
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
    runs its E passes on the head alone (`tffl.engine.feature_cache`): the same steps, ψ run once.

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
    _check_phases(phases, weight_decay, features_model)
    splits = [_cached_split(model, trainable, phase, features_model) for phase in phases]
    steps = [_make_step(model, features_model, loss_fn, optimizer, weight_decay, phase,
                        None if found is None else found[1], jit_compile)
             for phase, found in zip(phases, splits)]

    @tf.function
    def loop(weights, dataset):
        with placed(device):
            return _run_phases(weights, dataset, trainable, non_trainable, optimizer, phases,
                               splits, steps)

    return loop


def _check_phases(phases: Sequence[Phase], weight_decay: float,
                  features_model: tf.keras.Model | None) -> None:
    """`build_phased_loop`'s argument checks: ValueError naming the bad value."""
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


def _correct(y, pred):
    """Correct argmax predictions of a batch (float32; 0 unless `pred` is [batch, classes] scores
    for integer labels `y`)."""
    if not (y.dtype.is_integer and pred.shape.rank == 2 and (pred.shape[-1] or 0) > 1):
        return tf.constant(0.0, tf.float32)
    labels = tf.cast(tf.reshape(y, [-1]), tf.int64)
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(pred, -1), labels), tf.float32))


def _cached_split(model: tf.keras.Model, trainable: list, phase: Phase,
                  features_model: tf.keras.Model | None):
    """`(body, head)` when the phase runs on cached features (`tffl.engine.feature_cache`), else None."""
    if not (phase.cache_features and phase.epochs > 1):
        return None
    found = feature_cache.head_split(model, [trainable[i] for i in phase.train_indices])
    if found is not None and phase.penalty is not None and not _same_features(
            features_model, found[0]):
        return None
    return found


def _make_step(model: tf.keras.Model, features_model: tf.keras.Model | None, loss_fn: LossFn,
               optimizer: tff.learning.optimizers.Optimizer, weight_decay: float, phase: Phase,
               head, jit_compile: bool) -> Callable:
    """One SGD step of `phase` on a batch: `(x, y, optimizer state) -> (optimizer state,
    batch loss, batch size, correct predictions)`, XLA-compiled with `jit_compile`; with
    `head`, x is the batch's features and the step runs the head alone. The phase trains
    `model.trainable_variables[i]` for i in `phase.train_indices`."""
    trained = [model.trainable_variables[i] for i in phase.train_indices]

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
        return opt_state, tf.cast(loss, tf.float32), n, _correct(y, pred)

    return tf.function(step, jit_compile=True) if jit_compile else step


def _run_phases(weights, dataset, trainable: list, non_trainable: list,
                optimizer: tff.learning.optimizers.Optimizer, phases: Sequence[Phase],
                splits: list, steps: list) -> dict:
    """The body of `build_phased_loop`'s `tf.function`: assign `weights`, then run the phases
    (`steps[p]` the step of phase p, `splits[p]` its cached-feature split or None)."""
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
                x, y = model_spec.split_batch(batch)
                opt_state, loss, n, batch_correct = steps[p](x, y, opt_state)
                if last:
                    totals = _tally(totals, loss, n, batch_correct)
        else:  # ψ(x_k) once, then E passes of head steps (`tffl.engine.feature_cache`)
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


def _tally(totals, loss, n, correct):
    """`(loss_sum, num_correct, num_examples)` after one more batch of `n` examples."""
    loss_sum, num_correct, num_examples = totals
    return loss_sum + loss * n, num_correct + correct, num_examples + n


def _as_pair(*batch):
    """`dataset.map` function: a batch (tuple or mapping) -> `(x, y)`."""
    return model_spec.split_batch(batch[0] if len(batch) == 1 else batch)


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
