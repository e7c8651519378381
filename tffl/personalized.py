"""Personal heads on role-tagged Keras models: FedRep, FedPer, LG-FedAvg, FedAvg(-FT), FLUTE,
AdaptPFL.

Roles (`tffl.roles`): the variables tagged `head` (and, for AdaptPFL, `shortcut`) are *personal*
(they never leave the client); the trainable `shared`, `lora_a` and `lora_b` variables are the
*representation* φ, averaged by the server; `frozen` variables are never trained. Client i's model
is f(x; φ, h_i).

| algorithm   | local phases (η: SGD step, E: epochs = passes over the round's data) | aggregated |
|-------------|------------------------------------------------------------------------|-----------|
| `fedrep`    | h_i: τ_h epochs with φ fixed, then φ: τ_r epochs with h_i fixed        | φ         |
| `fedper`    | (h_i, φ) jointly for E epochs                                           | φ         |
| `lg_fedavg` | (h_i, φ) jointly for E epochs; the model's lower layers carry `head`   | φ (top)   |
| `fedavg`    | (h, φ) jointly for E epochs from the global model                       | h and φ   |
| `fedavg_ft` | as `fedavg`; at evaluation each client first fine-tunes h for E_ft     | h and φ   |
| `flute`     | h_i: τ_h epochs, then (h_i, φ) τ_r epochs, regularized; NC step on H_i | φ         |
| `adaptpfl`  | h_i: τ_w, shortcut s_i: τ_s, then φ: τ_b epochs                         | φ         |

(FedAvg trains every `head` and representation variable, so it also runs on untagged models.
FLUTE's regularizers are described at `FluteConfig`; AdaptPFL's mix (1−α)·f + α·s_i(x) is part of
the model, `models.paper_models.ShortcutMix`, so α = 0 is FedRep exactly.)

(srpfl.md §6.1–6.4.) LG-FedAvg is FedPer's schedule on the opposite split: its *lower* layers are
local, so they carry the personal role `head`, and its top layers are the shared representation
(`models.paper_models.build_mlp(split="lg")`). FedAvg keeps no personal state.

One communication round: the server broadcasts the model weights; client i replaces the personal
variables by its stored h_i, runs the phases (`tffl.client_training.build_phased_loop`, the one
training loop), uploads the deltas of the aggregated variables it trained, Δ_i = φ_i − φ, plus three
float32 metric sums, and returns its new h_i as personal state. The server applies
φ ← φ + agg(Δ_i) with a `tff.aggregators` factory (default `MeanFactory()`: Σ n_i Δ_i / Σ n_i; the
papers' splits have equal n_i, where it equals the simple 1/n mean of srpfl.md Alg. 1; pass
`UnweightedMeanFactory()` for 1/n always).

LoRA representation (`lora_schedule`): with "joint", A and B are trained and averaged together
(FedAvg-LoRA-style); with "alternating", each `next` is two communication rounds, RoLoRA-style: a
B round (φ-phase trains B, A fixed; B averaged) then an A round (φ-phase trains A; A averaged),
each with its own head phase; both rounds upload half the factors, and the averages are exact
(see `tffl.lora_fl`).

Stateful clients (`tffl.personal_state`): for the algorithms with personal variables the process
follows the stateful-clients template,

    next: (state@S, data@C, personal@C) -> PersonalizedOutput(state@S, personal@C, metrics@S)

where client i's personal state is the list of its personal variables' values (in
`model.trainable_variables` order; FLUTE appends its class indicator u_i) and
`initialize_personal(client_id)` is the model's initial head. FedAvg and FedAvg-FT have no personal state: their `next` is an ordinary
`tff.learning.templates.LearningProcess` `next`.

Evaluation (`evaluate`, a federated computation): each client starts from the global weights with
its stored h_i (algorithm-faithful: srpfl.md §8.2; the official code instead fine-tunes from the
averaged head), optionally fine-tunes h for `finetune_epochs` epochs on its training data (φ fixed),
and tests on its own test data. Reported: example-weighted `loss` and `accuracy` over all clients'
test examples, and `mean_client_accuracy`, the unweighted mean of the clients' accuracies.

Bytes per client per communication round (`traffic`): down = the broadcast model weights, up = the
uploaded deltas plus 12 metric bytes (+4 for the weight of a weighted aggregator) — read off the
types; the personal state is not traffic (it stays on the device).

Example:

>>> process = build_personalized_process("fedrep", model_fn, input_spec, 0.05,
...                                      head_epochs=10, representation_epochs=1)
>>> store = personal_state.PersonalStore(process.initialize_personal)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     out = process.next(state, datasets, store.lookup(client_ids))
...     store.update(client_ids, out.personal_states)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import client_training
from tffl import communication
from tffl import lora_fl
from tffl import roles
from tffl.personal_state import PersonalizedOutput

ALGORITHMS = ("fedrep", "fedper", "lg_fedavg", "fedavg", "fedavg_ft", "flute", "adaptpfl")
LORA_SCHEDULES = ("joint", "alternating")
REPRESENTATION_ROLES = (roles.SHARED, roles.LORA_A, roles.LORA_B)
PERSONAL_ROLES = (roles.HEAD,)
# Float32 metric sums every client uploads besides its deltas: loss sum, correct, examples.
METRIC_UPLOAD_BYTES = 3 * 4


def _default_loss() -> tf.keras.losses.Loss:
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@dataclasses.dataclass(frozen=True)
class _Config:
    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    loss_fn: Callable[[], client_training.LossFn]
    learning_rate: float
    server_learning_rate: float
    aggregator: Any
    spec: client_training.ModelSpec
    personal_indices: tuple[int, ...]
    flute: FluteConfig | None = None
    # FLUTE: position of the head kernel H (k×m) in `trainable`, and m.
    head_kernel_index: int | None = None
    num_classes: int = 0


@dataclasses.dataclass(frozen=True)
class FluteConfig:
    """Deep FLUTE's regularizers (flute.md §4.2–4.4): the local objective is

        CE + λ1·mean_batch ‖ψ(x)‖² + λ2·‖H‖²_F + λ3·NC(H; u_i)

    (the feature term only in the representation phase, as in the official code), and after local
    training the head takes one gradient step of size η_r on NC (the server step of Algorithm 2).

    Attributes:
      feature_penalty: λ1 ≥ 0. The code sums ‖ψ(x)‖² over a batch of 10 with 0.0005; the paper's
        Eq. (10) averages, as here: 0.005 is the code's value per example.
      head_penalty: λ2 ≥ 0 (code: 0.0025).
      nc_penalty: λ3 ≥ 0 (code: 0.25).
      nc_step: η_r ≥ 0, the NC step on the heads (code: 0.5).
    """

    feature_penalty: float = 0.005
    head_penalty: float = 0.0025
    nc_penalty: float = 0.25
    nc_step: float = 0.5

    def __post_init__(self):
        for name in ("feature_penalty", "head_penalty", "nc_penalty", "nc_step"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"FLUTE {name}={value} must be a finite number >= 0")


def neural_collapse(head_kernel: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
    """NC_i(H) = ‖ HᵀH/‖HᵀH‖_F − (1/√(m−1)) (u uᵀ) ⊙ (I_m − 11ᵀ/m) ‖_F  (flute.md §4.2).

    Args:
      head_kernel: H, shape (k, m) (a Keras Dense kernel: features × classes).
      classes: u, shape (m,), 1 for the classes the client holds, else 0.

    The client's sub-block of the m-class simplex-ETF Gram matrix is the target; heads of absent
    classes are pushed to 0. Norms use √(Σx² + 1e-12) so the gradient exists at 0.
    """
    h = tf.convert_to_tensor(head_kernel)
    m = h.shape[-1]
    dtype = h.dtype

    def frobenius(a):
        return tf.sqrt(tf.reduce_sum(tf.square(a)) + tf.constant(1e-12, dtype))

    gram = tf.matmul(h, h, transpose_a=True)
    gram = gram / frobenius(gram)
    u = tf.cast(classes, dtype)
    centering = tf.eye(m, dtype=dtype) - tf.ones((m, m), dtype) / m
    target = (u[:, tf.newaxis] * u[tf.newaxis, :]) * centering / np.sqrt(m - 1.0)
    return frobenius(gram - target)


def _features_model(model: tf.keras.Model, head_kernel: tf.Variable) -> tf.keras.Model:
    """`[input of the head layer, model output]`: the features ψ(x) beside the predictions."""
    for layer in model.layers:
        if any(w is head_kernel for w in layer.trainable_weights):
            return tf.keras.Model(model.inputs, [layer.input, model.output])
    raise ValueError(f"FLUTE: the head kernel {head_kernel.name} is not the kernel of a top-level "
                     "layer of the functional model, so its input features cannot be read")


def _class_indicator(previous: tf.Tensor, dataset, num_classes: int) -> tf.Tensor:
    """u_i: the classes seen in `dataset`'s labels, or-ed into the `previous` indicator."""

    def add(acc, batch):
        _, y = client_training.split_batch(batch)
        labels = tf.cast(tf.reshape(y, [-1]), tf.int32)
        seen = tf.reduce_max(tf.one_hot(labels, num_classes, dtype=acc.dtype), axis=0)
        return tf.maximum(acc, seen)

    return dataset.reduce(tf.cast(previous, tf.float32), add)


def _flute_phases(phases, model, flute: FluteConfig, kernel_index: int, classes,
                  head_indices: Sequence[int]):
    """The phases with FLUTE's penalties: head phases get λ2‖H‖² + λ3·NC, the others also
    λ1·mean‖ψ(x)‖²."""
    kernel = model.trainable_variables[kernel_index]

    def head_terms():
        return (flute.head_penalty * tf.reduce_sum(tf.square(kernel))
                + flute.nc_penalty * neural_collapse(kernel, classes))

    def head_only(features):
        del features
        return head_terms()

    def with_features(features):
        flat = tf.reshape(features, [tf.shape(features)[0], -1])
        return (flute.feature_penalty * tf.reduce_mean(tf.reduce_sum(tf.square(flat), axis=1))
                + head_terms())

    out = []
    for phase in phases:
        head_phase = set(phase.train_indices) <= set(head_indices)
        out.append(dataclasses.replace(
            phase, penalty=head_only if head_phase else with_features))
    return out


def _with_personal(weights, personal_indices, personal):
    """`ModelWeights` with the trainable values at `personal_indices` replaced by `personal`."""
    trainable = list(weights.trainable)
    for k, value in zip(personal_indices, personal, strict=True):
        trainable[k] = value
    return tff.learning.models.ModelWeights(trainable=trainable,
                                            non_trainable=list(weights.non_trainable))


class _Round:
    """One communication round: broadcast, local `phases`, upload the deltas at `upload_indices`,
    return the personal variables as personal state, apply the aggregated deltas."""

    def __init__(self, name: str, config: _Config, phases: Sequence[client_training.Phase],
                 upload_indices: Sequence[int]):
        self.name = name
        spec = config.spec
        self.upload_indices = tuple(upload_indices)
        personal_indices = config.personal_indices
        self.personal = bool(personal_indices)
        weights_type = spec.weights_type()
        data_type = tff.SequenceType(client_training.element_type(config.input_spec))
        personal_type = personal_state_type(spec, personal_indices, config.num_classes
                                            if config.flute else 0)
        flute = config.flute

        def work(weights, personal, dataset):
            model = client_training.build_model(config.keras_model_fn, config.input_spec,
                                                zero_init=True)
            personal = list(personal)
            features_model, round_phases, classes = None, phases, None
            if flute is not None:
                classes = _class_indicator(personal.pop(), dataset, config.num_classes)
                kernel = model.trainable_variables[config.head_kernel_index]
                features_model = _features_model(model, kernel)
                round_phases = _flute_phases(phases, model, flute, config.head_kernel_index,
                                             classes, personal_indices)
            loop = client_training.build_phased_loop(model, config.loss_fn(),
                                                     config.learning_rate, round_phases,
                                                     features_model)
            out = loop(_with_personal(weights, personal_indices, personal), dataset)
            trained = list(out["trainable"])
            if flute is not None and flute.nc_step > 0:
                # Algorithm 2's server step on Σ_j NC_j(H_j): its gradient in H_i is ∇NC_i(H_i),
                # so each head's step needs only that head; it is taken here, on the client.
                k = config.head_kernel_index
                with tf.GradientTape() as tape:
                    tape.watch(trained[k])
                    nc = neural_collapse(trained[k], classes)
                trained[k] = trained[k] - flute.nc_step * tape.gradient(nc, trained[k])
            upload = collections.OrderedDict(
                update=[trained[k] - weights.trainable[k] for k in self.upload_indices],
                loss_sum=out["loss_sum"],
                num_correct=out["num_correct"],
                num_examples=out["num_examples"],
            )
            new_personal = [trained[k] for k in personal_indices]
            if flute is not None:
                new_personal.append(classes)
            return collections.OrderedDict(upload=upload, personal=new_personal)

        if self.personal:
            @tff.tensorflow.computation(weights_type, personal_type, data_type)
            def client_work(weights, personal, dataset):
                return work(weights, personal, dataset)
        else:
            @tff.tensorflow.computation(weights_type, data_type)
            def client_work(weights, dataset):
                return work(weights, [], dataset)

        upload_type = client_work.type_signature.result["upload"]
        update_type = upload_type["update"]

        @tff.tensorflow.computation(weights_type, update_type)
        def server_apply(weights, update):
            trainable = list(weights.trainable)
            for k, delta in zip(self.upload_indices, update):
                trainable[k] = trainable[k] + tf.cast(config.server_learning_rate,
                                                      delta.dtype) * delta
            return tff.learning.models.ModelWeights(trainable=trainable,
                                                    non_trainable=list(weights.non_trainable))

        self.aggregator, self.weighted = lora_fl._create_aggregator(config.aggregator,
                                                                    update_type)
        self.client_work, self.server_apply = client_work, server_apply
        self.upload_type = upload_type
        self.traffic = communication.RoundTraffic(
            down=communication.type_bytes(weights_type),
            up=communication.type_bytes(upload_type) + (4 if self.weighted else 0),
        )

    def run(self, model, aggregator_state, data, personal):
        """Federated body -> (model@S, aggregator state@S, personal@C or None, metrics@S)."""
        at_clients = tff.federated_broadcast(model)
        if self.personal:
            out = tff.federated_map(self.client_work, (at_clients, personal, data))
        else:
            out = tff.federated_map(self.client_work, (at_clients, data))
        upload = out.upload
        if self.weighted:
            agg = self.aggregator.next(aggregator_state, upload.update, upload.num_examples)
        else:
            agg = self.aggregator.next(aggregator_state, upload.update)
        new_model = tff.federated_map(self.server_apply, (model, agg.result))
        metrics = tff.federated_zip(collections.OrderedDict(
            train=_train_metrics(upload), aggregator=agg.measurements))
        return new_model, agg.state, (out.personal if self.personal else None), metrics


@tff.tensorflow.computation(np.float32, np.float32)
def _divide(a, b):
    return tf.math.divide_no_nan(a, b)


def _train_metrics(upload):
    """Federated: example-weighted loss and accuracy of the last local phase, and Σ n_i."""
    num_examples = tff.federated_sum(upload.num_examples)
    return tff.federated_zip(collections.OrderedDict(
        loss=tff.federated_map(_divide, (tff.federated_sum(upload.loss_sum), num_examples)),
        accuracy=tff.federated_map(_divide, (tff.federated_sum(upload.num_correct),
                                             num_examples)),
        num_examples=num_examples,
    ))


def personal_state_type(spec: client_training.ModelSpec, personal_indices: Sequence[int],
                        num_classes: int = 0) -> tff.Type:
    """TFF type of one client's personal state: a list of its personal variables' tensors (and,
    for FLUTE, `num_classes` > 0, its float32 class indicator u_i)."""
    types = [tff.TensorType(spec.trainable[k].dtype, spec.trainable[k].shape)
             for k in personal_indices]
    if num_classes:
        types.append(tff.TensorType(np.float32, [num_classes]))
    return tff.types.to_type(types)


def _build_evaluate_loop(model, loss_fn):
    """`tf.function (weights, dataset) -> (loss_sum, num_correct, num_examples)` of `model` with
    `weights` (a `ModelWeights`) assigned."""

    @tf.function
    def evaluate(weights, dataset):
        for variable, value in zip(model.trainable_variables, weights.trainable, strict=True):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, weights.non_trainable,
                                   strict=True):
            variable.assign(value)
        loss_sum = tf.constant(0.0, tf.float32)
        num_correct = tf.constant(0.0, tf.float32)
        num_examples = tf.constant(0.0, tf.float32)
        for batch in iter(dataset):
            x, y = client_training.split_batch(batch)
            pred = model(x, training=False)
            n = tf.cast(tf.shape(y)[0], tf.float32)
            loss_sum += tf.cast(loss_fn(y, pred), tf.float32) * n
            labels = tf.cast(tf.reshape(y, [-1]), tf.int64)
            num_correct += tf.reduce_sum(
                tf.cast(tf.equal(tf.argmax(pred, -1), labels), tf.float32))
            num_examples += n
        return loss_sum, num_correct, num_examples

    return evaluate


class PersonalizationProcess(tff.learning.templates.LearningProcess):
    """A process of `ALGORITHMS` without personal state (FedAvg, FedAvg-FT).

    Besides the `LearningProcess` computations it has:
      algorithm: the name; spec: the model's `ModelSpec`;
      communication_rounds: `{name: standalone next of that one communication round}`;
      traffic: `{name: tffl.communication.RoundTraffic}` bytes per client of each round;
      upload_types: `{name: type}` what one client uploads in each round;
      evaluate_computation: the federated evaluation (see the module docstring).
    """

    def __init__(self, algorithm, initialize_fn, next_fn, get_fn, set_fn, communication_rounds,
                 traffic, upload_types, evaluate_fn, spec, personal_indices, finetune_epochs):
        super().__init__(initialize_fn, next_fn, get_fn, set_fn)
        self.algorithm = algorithm
        self.communication_rounds = communication_rounds
        self.traffic = traffic
        self.upload_types = upload_types
        self.evaluate_computation = evaluate_fn
        self.spec = spec
        self.personal_indices = personal_indices
        self.finetune_epochs = finetune_epochs

    def evaluate(self, state, train_data, test_data) -> dict[str, float]:
        """Personalized test metrics over the clients whose train/test datasets are given."""
        _check_same_length(train_data, test_data)
        return _floats(self.evaluate_computation(state, train_data, test_data))


class PersonalizedProcess:
    """A process of `ALGORITHMS` with personal state (FedRep, FedPer, LG-FedAvg): the
    stateful-clients template of `tffl.personal_state`.

    Attributes:
      initialize: `() -> state@SERVER` (a TFF computation).
      next_computation: `(state@S, data@C, personal@C) -> <state@S, personal@C, metrics@S>`.
      evaluate_computation: `(state@S, personal@C, train@C, test@C) -> metrics@S`.
      get_model_weights / set_model_weights: the global weights (the personal positions hold the
        model's initial values, which is what a client that never trained starts from).
      communication_rounds, traffic, upload_types, spec, algorithm: as `PersonalizationProcess`.
      personal_indices: positions in `model.trainable_variables` of the personal variables.
    """

    def __init__(self, algorithm, initialize_fn, next_fn, get_fn, set_fn, communication_rounds,
                 traffic, upload_types, evaluate_fn, spec, personal_indices, finetune_epochs,
                 class_indicator_size=0):
        self.algorithm = algorithm
        self.class_indicator_size = class_indicator_size
        self.initialize = initialize_fn
        self.next_computation = next_fn
        self.get_model_weights = get_fn
        self.set_model_weights = set_fn
        self.communication_rounds = communication_rounds
        self.traffic = traffic
        self.upload_types = upload_types
        self.evaluate_computation = evaluate_fn
        self.spec = spec
        self.personal_indices = personal_indices
        self.finetune_epochs = finetune_epochs
        self._initial_personal = None

    @property
    def state_type(self) -> tff.Type:
        return self.initialize.type_signature.result

    def initialize_personal(self, client_id: str) -> list[np.ndarray]:
        """Client `client_id`'s personal state before it ever trains: the model's initial personal
        variables (the same for every client; `client_id` is accepted for the template), and for
        FLUTE a zero class indicator."""
        del client_id
        if self._initial_personal is None:
            weights = self.get_model_weights(self.initialize())
            self._initial_personal = [np.asarray(weights.trainable[k])
                                      for k in self.personal_indices]
            if self.class_indicator_size:  # FLUTE: no class seen yet
                self._initial_personal.append(np.zeros(self.class_indicator_size, np.float32))
        return [v.copy() for v in self._initial_personal]

    def _check_personal(self, client_data, personal_states) -> None:
        personal_states = list(personal_states)
        if len(personal_states) != len(client_data):
            raise ValueError(f"{len(client_data)} client datasets but {len(personal_states)} "
                             "personal states: pass one personal state per client, in order")
        for i, values in enumerate(personal_states):
            values = list(values)
            expected = len(self.personal_indices) + (1 if self.class_indicator_size else 0)
            if len(values) != expected:
                raise ValueError(f"personal state {i} has {len(values)} tensors; this process's "
                                 f"has {expected}")
            shapes = [(self.spec.trainable[k].name, self.spec.trainable[k].shape)
                      for k in self.personal_indices]
            if self.class_indicator_size:
                shapes.append(("class indicator", (self.class_indicator_size,)))
            for (name, shape), value in zip(shapes, values):
                if tuple(np.shape(value)) != shape:
                    raise ValueError(f"personal state {i}: {name} must have shape "
                                     f"{shape}, got {tuple(np.shape(value))}")

    def next(self, state, client_data, personal_states) -> PersonalizedOutput:
        """One `next` (1 or 2 communication rounds) on the clients' datasets and states."""
        self._check_personal(client_data, personal_states)
        state, personal, metrics = self.next_computation(state, client_data,
                                                         list(personal_states))
        return PersonalizedOutput(state, list(personal), metrics)

    def evaluate(self, state, personal_states, train_data, test_data) -> dict[str, float]:
        """Personalized test metrics: client i uses its `personal_states[i]`."""
        self._check_personal(train_data, personal_states)
        _check_same_length(train_data, test_data)
        return _floats(self.evaluate_computation(state, list(personal_states), train_data,
                                                 test_data))


def _check_same_length(train_data, test_data):
    if len(train_data) != len(test_data):
        raise ValueError(f"{len(train_data)} training but {len(test_data)} test datasets: "
                         "evaluation needs both for every client, in the same order")


def _floats(metrics) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def _check_epochs(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name}={value} must be an integer >= {minimum}")
    return int(value)


def build_personalized_process(
    algorithm: str,
    keras_model_fn: Callable[[], tf.keras.Model],
    input_spec,
    client_learning_rate: float,
    *,
    local_epochs: int = 1,
    head_epochs: int = 1,
    representation_epochs: int = 1,
    shortcut_epochs: int = 1,
    finetune_epochs: int | None = None,
    flute: FluteConfig | None = None,
    lora_schedule: str = "joint",
    loss_fn: Callable[[], client_training.LossFn] | None = None,
    aggregator=None,
    server_learning_rate: float = 1.0,
) -> PersonalizationProcess | PersonalizedProcess:
    """Builds FedRep, FedPer, LG-FedAvg, FedAvg or FedAvg-FT (see the module docstring).

    Args:
      algorithm: one of `ALGORITHMS`.
      keras_model_fn: no-arg function returning a fresh Keras model whose personal variables carry
        the role `head` and whose representation carries `shared` / `lora_a` / `lora_b`.
      input_spec: element spec `(x, y)` of a client's batched dataset.
      client_learning_rate: local SGD step η > 0.
      local_epochs: E ≥ 1, epochs of joint training (FedPer, LG-FedAvg, FedAvg, FedAvg-FT).
      head_epochs: τ_h ≥ 1, FedRep's head epochs per round.
      representation_epochs: τ_r ≥ 1, FedRep's (FLUTE's, AdaptPFL's τ_b) representation epochs
        per round.
      shortcut_epochs: τ_s ≥ 1, AdaptPFL's shortcut epochs (between the head and the
        representation phases).
      flute: FLUTE's regularizers (default `FluteConfig()`, the official code's values); only for
        `algorithm="flute"`.
      finetune_epochs: E_ft ≥ 0, head fine-tuning epochs before evaluation (default 10 for
        `fedavg_ft`, as in srpfl.md §6.4; 0 otherwise; `fedavg` must keep 0).
      lora_schedule: "joint" or "alternating" (RoLoRA-style B then A rounds; needs LoRA factors).
      loss_fn: no-arg function returning `(y_true, y_pred) -> scalar` (default: sparse
        categorical cross-entropy on logits).
      aggregator: a `tff.aggregators` factory for the deltas (default `MeanFactory()`).
      server_learning_rate: η_s > 0, φ ← φ + η_s·agg(Δ_i) (default 1: the average itself).

    Raises:
      ValueError: unknown algorithm or schedule; an epoch count ≤ 0; η ≤ 0; a split that leaves
        the personal (`head`) or the representation role empty; "alternating" without LoRA.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown personalized algorithm {algorithm!r}; expected one of "
                         f"{', '.join(ALGORITHMS)}")
    if lora_schedule not in LORA_SCHEDULES:
        raise ValueError(f"lora_schedule={lora_schedule!r} must be one of "
                         f"{', '.join(LORA_SCHEDULES)}")
    if not (np.isfinite(client_learning_rate) and client_learning_rate > 0):
        raise ValueError(f"client_learning_rate={client_learning_rate} must be a finite number "
                         "> 0")
    if not (np.isfinite(server_learning_rate) and server_learning_rate > 0):
        raise ValueError(f"server_learning_rate={server_learning_rate} must be a finite number "
                         "> 0")
    local_epochs = _check_epochs("local_epochs", local_epochs)
    head_epochs = _check_epochs("head_epochs (τ_h)", head_epochs)
    representation_epochs = _check_epochs("representation_epochs (τ_r)", representation_epochs)
    shortcut_epochs = _check_epochs("shortcut_epochs (τ_s)", shortcut_epochs)
    if flute is not None and algorithm != "flute":
        raise ValueError(f"flute regularizers were given for algorithm {algorithm!r}; they "
                         "apply only to 'flute'")
    if algorithm == "flute" and flute is None:
        flute = FluteConfig()
    if finetune_epochs is None:
        finetune_epochs = 10 if algorithm == "fedavg_ft" else 0
    finetune_epochs = _check_epochs("finetune_epochs", finetune_epochs, minimum=0)
    if algorithm == "fedavg" and finetune_epochs:
        raise ValueError("fedavg evaluates the global model as it is; for head fine-tuning "
                         "before evaluation use fedavg_ft")

    spec = client_training.inspect_model(keras_model_fn, input_spec)
    head = spec.indices(PERSONAL_ROLES)
    shortcut = spec.indices([roles.SHORTCUT])
    representation = spec.indices(REPRESENTATION_ROLES)
    layout = ", ".join(f"{v.name}:{v.role}" for v in spec.trainable) or "none"
    if not head and algorithm != "fedavg":
        raise ValueError(
            f"{algorithm} needs personal variables (role {roles.HEAD!r}: the head, or "
            f"LG-FedAvg's local layers) but the model has none; tag them with "
            f"tffl.roles.tag_layer(layer, {roles.HEAD!r}). Trainable variables: {layout}")
    if not representation and algorithm != "fedavg":
        raise ValueError(
            f"{algorithm} needs a representation to aggregate (trainable variables with roles "
            f"{', '.join(REPRESENTATION_ROLES)}) but the model has none. Trainable variables: "
            f"{layout}")
    if not head + representation:
        raise ValueError(f"{algorithm}: the model has no trainable variables to train")
    if algorithm == "adaptpfl" and not shortcut:
        raise ValueError(
            f"adaptpfl needs a personal shortcut (variables with role {roles.SHORTCUT!r}), but "
            "the model has none: build it with a shortcut branch, e.g. "
            f"models.paper_models.build_mlp(shortcut_alpha=α). Trainable variables: {layout}")
    personal = () if algorithm in ("fedavg", "fedavg_ft") else head
    if algorithm == "adaptpfl":
        personal = tuple(sorted(head + shortcut))
    kernel_index, num_classes = None, 0
    if algorithm == "flute":
        kernels = [k for k in head if len(spec.trainable[k].shape) == 2]
        if len(kernels) != 1:
            raise ValueError(f"flute needs exactly one head kernel H (k×m), found "
                             f"{[spec.trainable[k].name for k in kernels]}")
        kernel_index = kernels[0]
        num_classes = spec.trainable[kernel_index].shape[1]
        if num_classes < 2:
            raise ValueError(f"flute's neural-collapse term needs m >= 2 classes, the head "
                             f"kernel {spec.trainable[kernel_index].name} has {num_classes}")
        y_spec = client_training.split_batch(input_spec)[1]
        if not y_spec.dtype.is_integer:
            raise ValueError(f"flute needs integer class labels, got {y_spec.dtype.name}")
    config = _Config(
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        loss_fn=loss_fn or _default_loss,
        learning_rate=float(client_learning_rate),
        server_learning_rate=float(server_learning_rate),
        aggregator=aggregator if aggregator is not None else tff.aggregators.MeanFactory(),
        spec=spec,
        personal_indices=tuple(personal),
        flute=flute,
        head_kernel_index=kernel_index,
        num_classes=num_classes,
    )

    def phases_for(rep: tuple[int, ...]) -> list[client_training.Phase]:
        if algorithm in ("fedrep", "flute"):
            # FLUTE as the official code runs it: head-only epochs, then joint epochs.
            second = rep if algorithm == "fedrep" else tuple(sorted(head + rep))
            return [client_training.Phase(head, head_epochs),
                    client_training.Phase(second, representation_epochs)]
        if algorithm == "adaptpfl":
            return [client_training.Phase(head, head_epochs),
                    client_training.Phase(shortcut, shortcut_epochs),
                    client_training.Phase(rep, representation_epochs)]
        return [client_training.Phase(tuple(sorted(head + rep)), local_epochs)]

    if lora_schedule == "alternating":
        a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
        if not a_idx or not b_idx:
            raise ValueError("lora_schedule='alternating' alternates the LoRA factors, but the "
                             f"model has no trainable lora_a/lora_b variables: {layout}")
        lora_fl.lora_pairs(spec)
        others = tuple(k for k in representation if k not in a_idx + b_idx)
        rep_sets = {"b_round": tuple(sorted(others + b_idx)),
                    "a_round": tuple(sorted(others + a_idx))}
    else:
        rep_sets = {"round": representation}
    rounds = []
    for name, rep in rep_sets.items():
        trained = sorted({k for phase in phases_for(rep) for k in phase.train_indices})
        upload = [k for k in trained if k not in config.personal_indices]
        rounds.append(_Round(name, config, phases_for(rep), upload))
    return _compose(algorithm, config, rounds, head, finetune_epochs)


def _compose(algorithm, config: _Config, rounds: Sequence[_Round], head: tuple[int, ...],
             finetune_epochs: int):
    spec = config.spec
    weights_type = spec.weights_type()
    personal_indices = config.personal_indices
    has_personal = bool(personal_indices)

    @tff.tensorflow.computation
    def initial_weights():
        model = client_training.build_model(config.keras_model_fn, config.input_spec)
        return tff.learning.models.ModelWeights(
            trainable=[v.read_value() for v in model.trainable_variables],
            non_trainable=[v.read_value() for v in model.non_trainable_variables])

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(collections.OrderedDict(
            model=tff.federated_eval(initial_weights, tff.SERVER),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
            aggregator=tff.federated_zip(collections.OrderedDict(
                (r.name, r.aggregator.initialize()) for r in rounds)),
        ))

    state_type = initialize.type_signature.result
    data_type = tff.FederatedType(
        tff.SequenceType(client_training.element_type(config.input_spec)), tff.CLIENTS)
    personal_type = tff.FederatedType(
        personal_state_type(spec, personal_indices, config.num_classes if config.flute else 0),
        tff.CLIENTS)

    def body(state, data, personal, which):
        model = state.model
        agg_states = collections.OrderedDict((r.name, state.aggregator[r.name]) for r in rounds)
        metrics = collections.OrderedDict()
        for r in which:
            model, agg_states[r.name], personal, metrics[r.name] = r.run(
                model, agg_states[r.name], data, personal)
        new_state = tff.federated_zip(collections.OrderedDict(
            model=model,
            round_num=tff.federated_map(lora_fl._increment(len(which)), state.round_num),
            aggregator=tff.federated_zip(agg_states),
        ))
        metrics = metrics[which[0].name] if len(which) == 1 else tff.federated_zip(metrics)
        return new_state, personal, metrics

    def build_next(which):
        if has_personal:
            @tff.federated_computation(state_type, data_type, personal_type)
            def next_fn(state, data, personal):
                return body(state, data, personal, which)
        else:
            @tff.federated_computation(state_type, data_type)
            def next_fn(state, data):
                new_state, _, metrics = body(state, data, None, which)
                return tff.learning.templates.LearningProcessOutput(new_state, metrics)
        return next_fn

    next_fn = build_next(list(rounds))
    communication_rounds = collections.OrderedDict((r.name, build_next([r])) for r in rounds)
    traffic = collections.OrderedDict((r.name, r.traffic) for r in rounds)
    upload_types = collections.OrderedDict((r.name, r.upload_type) for r in rounds)

    train_data_type = data_type
    test_data_type = data_type
    finetune = [client_training.Phase(head, finetune_epochs)] if finetune_epochs else []

    def client_eval(weights, personal, train_ds, test_ds):
        model = client_training.build_model(config.keras_model_fn, config.input_spec,
                                            zero_init=True)
        weights = _with_personal(weights, personal_indices,
                                 list(personal)[:len(personal_indices)])
        if finetune:
            loop = client_training.build_phased_loop(model, config.loss_fn(),
                                                     config.learning_rate, finetune)
            trained = loop(weights, train_ds)["trainable"]
            weights = tff.learning.models.ModelWeights(trainable=trained,
                                                       non_trainable=list(weights.non_trainable))
        loss_sum, num_correct, num_examples = _build_evaluate_loop(
            model, config.loss_fn())(weights, test_ds)
        accuracy = tf.math.divide_no_nan(num_correct, num_examples)
        return collections.OrderedDict(loss_sum=loss_sum, num_correct=num_correct,
                                       num_examples=num_examples, accuracy=accuracy)

    if has_personal:
        @tff.tensorflow.computation(weights_type, personal_type.member, train_data_type.member,
                                    test_data_type.member)
        def client_evaluate(weights, personal, train_ds, test_ds):
            return client_eval(weights, personal, train_ds, test_ds)
    else:
        @tff.tensorflow.computation(weights_type, train_data_type.member, test_data_type.member)
        def client_evaluate(weights, train_ds, test_ds):
            return client_eval(weights, [], train_ds, test_ds)

    def summarize(out):
        num_examples = tff.federated_sum(out.num_examples)
        return tff.federated_zip(collections.OrderedDict(
            loss=tff.federated_map(_divide, (tff.federated_sum(out.loss_sum), num_examples)),
            accuracy=tff.federated_map(_divide, (tff.federated_sum(out.num_correct),
                                                 num_examples)),
            mean_client_accuracy=tff.federated_mean(out.accuracy),
            num_examples=num_examples,
        ))

    if has_personal:
        @tff.federated_computation(state_type, personal_type, train_data_type, test_data_type)
        def evaluate(state, personal, train, test):
            at_clients = tff.federated_broadcast(state.model)
            return summarize(tff.federated_map(client_evaluate,
                                               (at_clients, personal, train, test)))
    else:
        @tff.federated_computation(state_type, train_data_type, test_data_type)
        def evaluate(state, train, test):
            at_clients = tff.federated_broadcast(state.model)
            return summarize(tff.federated_map(client_evaluate, (at_clients, train, test)))

    @tff.tensorflow.computation(state_type.member)
    def get_model_weights(state):
        return state["model"]

    @tff.tensorflow.computation(state_type.member, weights_type)
    def set_model_weights(state, weights):
        return collections.OrderedDict(model=weights, round_num=state["round_num"],
                                       aggregator=state["aggregator"])

    if not has_personal:
        return PersonalizationProcess(
            algorithm, initialize, next_fn, get_model_weights, set_model_weights,
            communication_rounds, traffic, upload_types, evaluate, spec, personal_indices,
            finetune_epochs)
    return PersonalizedProcess(
        algorithm, initialize, next_fn, get_model_weights, set_model_weights,
        communication_rounds, traffic, upload_types, evaluate, spec, personal_indices,
        finetune_epochs, class_indicator_size=config.num_classes if config.flute else 0)

