"""Processes: round kinds of `tffl.engine` composed with one shared state and run by a schedule.

Every round kind of an algorithm is composed from the same four pieces
(`tff.learning.templates.compose_learning_process` for stateless clients, `compose_personalized`
for clients with personal state), with the aggregator and finalizer states keyed by round name
and a `round_num` counter in the finalizer state. So all kinds share one state type and one
`initialize`, and the algorithm is `schedule: t ↦ round name` (t = communication rounds done):

| algorithm    | schedule                                                      |
|--------------|---------------------------------------------------------------|
| one kind     | t ↦ that kind                                                 |
| RoLoRA       | t ↦ `b_round` if t is even else `a_round`                      |
| RoLoRA→FFA   | as RoLoRA while t < switch, then `b_round`                     |

`next` runs ONE communication round (the kind the state's `round_num` selects) on the data it is
given, so every communication round gets its own client data. The kinds' own computations,
`process.rounds[name]`, are ordinary federated computations of identical type: a TFF pipeline
embeds an algorithm by calling them in the schedule's order.

Two process protocols:

- `ScheduledProcess`, a `tff.learning.templates.LearningProcess`:
  `next(state, data@CLIENTS) -> LearningProcessOutput(state, metrics)`;
- `PersonalizedProcess` (`tffl.personal_state`'s stateful clients):
  `next(state, data@CLIENTS, personal@CLIENTS) -> PersonalizedOutput(state, personal, metrics)`,
  plus `initialize_personal(client_id)`.

Both have `round_name(state)`, `traffic` ({round name: bytes per client}), `model` (the
`tffl.engine.FederatedModel`: frozen weights and their fingerprint) and
`model_weights(state)` (the whole model's weights, frozen ones included, as numpy).

Example:

>>> with runtime.local_runtime():                       # `process`: RoLoRA
...     state = process.initialize()
...     first = process.round_name(state)
...     state = process.next(state, datasets).state     # one B round
...     second = process.round_name(state)
>>> first, second
('b_round', 'a_round')
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import communication
from tffl import engine
from tffl.personal_state import PersonalizedOutput

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


def _keyed_aggregator(pieces: Sequence[engine.RoundPieces], name: str):
    """The aggregation of round `name`, with state {round: state} of every round kind."""
    own = next(p for p in pieces if p.name == name)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(collections.OrderedDict(
            (p.name, p.aggregator.initialize()) for p in pieces))

    params = own.aggregator.next.type_signature.parameter

    @tff.federated_computation(initialize.type_signature.result, params[1], params[2])
    def next_fn(state, value, weight):
        out = own.aggregator.next(state[name], value, weight)
        new = collections.OrderedDict(
            (p.name, out.state if p.name == name else state[p.name]) for p in pieces)
        return tff.templates.MeasuredProcessOutput(tff.federated_zip(new), out.result,
                                                   out.measurements)

    return tff.templates.AggregationProcess(initialize, next_fn)


def _increment():
    @tff.tensorflow.computation(np.int32)
    def add_one(n):
        return n + 1

    return add_one


def _keyed_finalizer(pieces: Sequence[engine.RoundPieces], name: str, weights_type):
    """The server step of round `name`; state {round_num, steps: {round: state}}. With the
    round's `measure`, the aggregate is (the step's update, a diagnostic) and the measurements
    are `measure(w, diagnostic)` on the weights w the round started from."""
    own = next(p for p in pieces if p.name == name)

    @tff.federated_computation
    def initialize():
        steps = collections.OrderedDict(
            (p.name, tff.federated_eval(p.step.initialize, tff.SERVER)) for p in pieces)
        return tff.federated_zip(collections.OrderedDict(
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
            steps=tff.federated_zip(steps)))

    update_type = own.aggregator.next.type_signature.result.result.member

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(weights_type, tff.SERVER),
                               tff.FederatedType(update_type, tff.SERVER))
    def next_fn(state, weights, update):
        round_num = tff.federated_map(_increment(), state.round_num)
        if own.measure is None:
            measurements = tff.federated_value(collections.OrderedDict(), tff.SERVER)
        else:
            measurements = tff.federated_map(own.measure, (weights, update[1]))
            update = update[0]
        step_state, new_weights = tff.federated_map(
            own.step.apply, (state.steps[name], weights, update, round_num))
        steps = collections.OrderedDict(
            (p.name, step_state if p.name == name else state.steps[p.name]) for p in pieces)
        new_state = tff.federated_zip(collections.OrderedDict(
            round_num=round_num, steps=tff.federated_zip(steps)))
        return tff.templates.MeasuredProcessOutput(new_state, new_weights, measurements)

    return tff.learning.templates.FinalizerProcess(initialize, next_fn)


def _client_work(piece: engine.RoundPieces, weights_type, data_type):
    @tff.federated_computation
    def initialize():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(weights_type, tff.CLIENTS),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def next_fn(state, weights, data):
        result, sums, _ = tff.federated_map(piece.client_update, (weights, data))
        return tff.templates.MeasuredProcessOutput(state, result, engine.train_metrics(sums))

    return tff.learning.templates.ClientWorkProcess(initialize, next_fn)


def _initial_weights_fn(model: engine.FederatedModel):
    initial = model.initial_global

    @tff.tensorflow.computation
    def initial_weights():
        return tff.learning.models.ModelWeights(
            trainable=[tf.constant(v) for v in initial.trainable],
            non_trainable=[tf.constant(v) for v in initial.non_trainable])

    return initial_weights


@tff.tensorflow.computation(np.float32)
def _as_round_values(count):
    return [count]


def compose_personalized(initial_weights_fn, distributor, client_update, aggregator, finalizer,
                         data_type, personal_type, count_clients: bool = False):
    """`compose_learning_process`'s round with the personal state in and out at CLIENTS:
    `next(state, data@C, personal@C) -> (state, personal@C, metrics)`; the same state type.

    With `count_clients` (a hook's round input `num_clients`), the round first sums one per
    client and broadcasts |I| to every client beside the weights."""

    @tff.tensorflow.computation(data_type)
    def one(dataset):
        del dataset
        return tf.constant(1.0, tf.float32)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(LearningAlgorithmState(
            tff.federated_eval(initial_weights_fn, tff.SERVER), distributor.initialize(),
            tff.federated_value((), tff.SERVER), aggregator.initialize(),
            finalizer.initialize()))

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(data_type, tff.CLIENTS),
                               tff.FederatedType(personal_type, tff.CLIENTS))
    def next_fn(state, data, personal):
        sent = distributor.next(state.distributor, state.global_model_weights)
        if count_clients:
            count = tff.federated_broadcast(tff.federated_sum(tff.federated_map(one, data)))
            result, sums, new_personal = tff.federated_map(
                client_update, (sent.result, data, personal,
                                tff.federated_map(_as_round_values, count)))
        else:
            result, sums, new_personal = tff.federated_map(client_update,
                                                           (sent.result, data, personal))
        aggregated = aggregator.next(state.aggregator, result.update, result.update_weight)
        final = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
        new_state = tff.federated_zip(LearningAlgorithmState(
            final.result, sent.state, state.client_work, aggregated.state, final.state))
        metrics = tff.federated_zip(collections.OrderedDict(
            distributor=sent.measurements, client_work=engine.train_metrics(sums),
            aggregator=aggregated.measurements, finalizer=final.measurements))
        return new_state, new_personal, metrics

    return initialize, next_fn


def compose_rounds(model: engine.FederatedModel, pieces: Sequence[engine.RoundPieces],
                   personal: bool, hook=None):
    """`(initialize, {round name: next})`: every kind composed with the keyed states."""
    weights_type, data_type = model.layout.global_type(), model.data_type()
    initial = _initial_weights_fn(model)
    rounds, initialize = collections.OrderedDict(), None
    for piece in pieces:
        distributor = tff.learning.templates.build_broadcast_process(weights_type)
        aggregator = _keyed_aggregator(pieces, piece.name)
        finalizer = _keyed_finalizer(pieces, piece.name, weights_type)
        if personal:
            init, next_fn = compose_personalized(
                initial, distributor, piece.client_update, aggregator, finalizer, data_type,
                engine.personal_type(model, hook),
                count_clients="num_clients" in engine.round_inputs(hook))
        else:
            composed = tff.learning.templates.compose_learning_process(
                initial, distributor, _client_work(piece, weights_type, data_type), aggregator,
                finalizer)
            init, next_fn = composed.initialize, composed.next
        initialize = initialize or init
        rounds[piece.name] = next_fn
    return initialize, rounds


@runtime_checkable
class RoundProtocol(Protocol):
    """What `tffl.simulation.run_rounds` reads from a process besides `initialize`/`next`:
    which round kind `next(state, ...)` runs, its bytes per client, and the fingerprint of the
    frozen weights the state belongs to. Both `ScheduledProcess` and `PersonalizedProcess`
    follow it (and so does any wrapper that forwards these attributes)."""

    traffic: Mapping[str, Any]
    frozen_fingerprint: str

    def round_name(self, state) -> str: ...


class Scheduled:
    """What both process protocols share: the schedule, the rounds, traffic and weights."""

    def _setup(self, algorithm: str, model: engine.FederatedModel,
               pieces: Sequence[engine.RoundPieces], rounds: Mapping[str, tff.Computation],
               schedule: Callable[[int], str], traffic_rounds=None):
        self.algorithm = algorithm
        self.model = model
        self.rounds = collections.OrderedDict(rounds)
        self.schedule = schedule
        # Bytes per client per round kind from the types the client work returns; `traffic`
        # refines them with TFF's own sizing of each round (`tffl.communication.round_traffic`).
        self.declared_traffic = collections.OrderedDict((p.name, p.traffic) for p in pieces)
        self.upload_types = collections.OrderedDict((p.name, p.upload_type) for p in pieces)
        # `() -> {round name: computation}` whose traffic `traffic` reports (default `rounds`):
        # the rounds without a simulation-only diagnostic's extra aggregation.
        self._traffic_rounds = traffic_rounds
        self._traffic = None

    @property
    def traffic(self) -> Mapping[str, communication.RoundTraffic]:
        """{round name: bytes down/up per client}, read off TFF's DistributeAggregateForm (or
        MapReduceForm) of each round, which counts what the aggregator really moves (e.g. a
        `SumFactory` sends no weight, DP broadcasts its clip); for rounds neither form can hold
        (personal state returned at CLIENTS), the declared figures: the broadcast federated
        weights, and `ClientResult(update, weight)` plus the metric sums."""
        if self._traffic is None:
            traffic = collections.OrderedDict()
            rounds = self._traffic_rounds() if self._traffic_rounds else self.rounds
            for name, computation in rounds.items():
                try:
                    traffic[name] = communication.round_traffic(computation)
                except ValueError:
                    traffic[name] = self.declared_traffic[name]
            self._traffic = traffic
        return self._traffic

    @property
    def spec(self):
        return self.model.spec

    @property
    def communication_rounds(self) -> Mapping[str, tff.Computation]:
        """`rounds`: {round name: federated computation of one communication round}."""
        return self.rounds

    @property
    def frozen_fingerprint(self) -> str:
        return self.model.frozen.fingerprint

    @staticmethod
    def round_num(state) -> int:
        """Communication rounds done (the finalizer's counter)."""
        return int(np.asarray(state.finalizer["round_num"]))

    def round_name(self, state) -> str:
        """The round kind the next call of `next` runs.

        Raises:
          FileNotFoundError: the frozen-weights file the clients read is gone (e.g. a cleaned
            cache), naming it, instead of an error from inside the worker.
        """
        self.model.frozen.check_readable()
        name = self.schedule(self.round_num(state))
        if name not in self.rounds:
            raise ValueError(f"schedule of {self.algorithm} chose {name!r}, not one of "
                             f"{list(self.rounds)}")
        return name

    def _metrics(self, name, metrics):
        return collections.OrderedDict([(name, metrics)]) if len(self.rounds) > 1 else metrics

    def model_weights(self, state, personal=None) -> tff.learning.models.ModelWeights:
        """The whole model's weights (numpy): the state's federated ones, the frozen base, and
        the personal values if given (else the model's initial ones)."""
        return self.model.full_weights(state.global_model_weights, personal)

    def with_model_weights(self, state, weights):
        """`state` with the federated part of the whole-model `weights`.

        Raises:
          ValueError: a shape differs from the model's, or a value of a variable this process
            does not federate (frozen, never trained, or personal) differs from the one the
            process was built with: those live in the frozen-weights file and personal states,
            not in the state (build the process with `initial_non_trainable=` instead).
        """
        layout = self.model.layout
        check_weights_shapes(self.spec, weights)
        given = layout.base_values(weights.trainable, weights.non_trainable)
        infos = layout.base_infos()
        for info, value, kept in zip(infos, given, self.model.frozen.load(), strict=True):
            if not np.array_equal(value, kept):
                raise ValueError(
                    f"with_model_weights: {info.name} (role {info.role}) is not federated by "
                    f"{self.algorithm}, so the state cannot hold another value for it; it comes "
                    f"from the frozen weights {self.model.frozen.fingerprint} (or a client's "
                    "personal state). Build the process with initial_non_trainable= to start "
                    "from other frozen weights.")
        return self._set_weights_computation(
            state, layout.global_values(weights.trainable, weights.non_trainable))

    def check_global_weights(self, weights) -> None:
        """Raises `ValueError` naming the variable if `weights` (federated `ModelWeights`) do
        not fit this process's model (e.g. LoRA factors of another rank)."""
        layout = self.model.layout
        infos = ([self.spec.trainable[k] for k in layout.trainable],
                 [self.spec.non_trainable[k] for k in layout.non_trainable])
        _check_infos(infos, (weights.trainable, weights.non_trainable), "set_model_weights")


def _check_infos(infos, groups, what: str) -> None:
    from tffl import roles

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
    groups = ((weights.trainable, weights.non_trainable) if hasattr(weights, "trainable")
              else tuple(weights))
    _check_infos((spec.trainable, spec.non_trainable), groups, "set_model_weights")


def _weights_computations(initialize):
    """`(get_model_weights, set_model_weights)` TF computations on the state's federated
    weights (`global_model_weights`), as `compose_learning_process` builds them."""
    state_type = initialize.type_signature.result.member

    @tff.tensorflow.computation(state_type)
    def get_model_weights(state):
        return state.global_model_weights

    @tff.tensorflow.computation(state_type, state_type.global_model_weights)
    def set_model_weights(state, weights):
        return LearningAlgorithmState(weights, state.distributor, state.client_work,
                                      state.aggregator, state.finalizer)

    return get_model_weights, set_model_weights


class ScheduledProcess(Scheduled, tff.learning.templates.LearningProcess):
    """A `LearningProcess` whose `next` runs one communication round of the schedule.

    With one round kind, `next` is that kind's federated computation itself; with several it
    reads `round_num` from the state and calls the kind's computation (`rounds[name]`), and its
    metrics are `{name: metrics}`.
    """

    def __init__(self, algorithm, model, pieces, initialize, rounds, schedule,
                 traffic_rounds=None):
        self._setup(algorithm, model, pieces, rounds, schedule, traffic_rounds)
        first = next(iter(self.rounds.values()))
        get_model_weights, self._set_weights_computation = _weights_computations(initialize)
        super().__init__(initialize, first, get_model_weights, self._set_weights_computation)

    @property
    def next(self):
        if len(self.rounds) == 1:
            return next(iter(self.rounds.values()))
        return self._next

    def _next(self, state, client_data) -> tff.learning.templates.LearningProcessOutput:
        name = self.round_name(state)
        output = self.rounds[name](state, client_data)
        return tff.learning.templates.LearningProcessOutput(output.state,
                                                            self._metrics(name, output.metrics))

    @property
    def set_model_weights(self):
        """`(state, federated ModelWeights) -> state`, shapes checked first."""

        def set_weights(state, weights):
            self.check_global_weights(weights)
            return self._set_weights_computation(state, weights)

        set_weights.type_signature = self._set_weights_computation.type_signature
        return set_weights


class PersonalizedProcess(Scheduled):
    """The stateful-clients protocol (`tffl.personal_state`) on the engine's rounds.

    Attributes beyond `Scheduled`'s: `initialize` (a TFF computation), `get_model_weights`
    (the federated weights), `hook` (the algorithm's `engine.ClientHook`, e.g. FLUTE's).
    """

    def __init__(self, algorithm, model, pieces, initialize, rounds, schedule, hook=None):
        self._setup(algorithm, model, pieces, rounds, schedule)
        self.initialize = initialize
        self.hook = hook
        self.get_model_weights, self._set_weights_computation = _weights_computations(initialize)
        self._extra = [np.zeros(t.shape, np.dtype(getattr(t.dtype, "as_numpy_dtype", t.dtype)))
                       for t in (hook.extra_types if hook else ())]

    @property
    def state_type(self) -> tff.Type:
        return self.initialize.type_signature.result

    def set_model_weights(self, state, weights):
        self.check_global_weights(weights)
        return self._set_weights_computation(state, weights)

    def initialize_personal(self, client_id: str) -> list[np.ndarray]:
        """A client's personal state before it trains: the model's initial personal variables
        (the same for every client) and the hook's zero-initialized extras."""
        del client_id
        return [np.array(v) for v in self.model.initial_personal] + [v.copy() for v in self._extra]

    def _personal_template(self) -> list[np.ndarray]:
        """Arrays of every personal state's shapes and dtypes."""
        return self.initialize_personal("")

    def check_personal(self, client_data, personal_states) -> None:
        personal_states = list(personal_states)
        if len(personal_states) != len(client_data):
            raise ValueError(f"{len(client_data)} client datasets but {len(personal_states)} "
                             "personal states: pass one personal state per client, in order")
        template = self._personal_template()
        names = [self.spec.trainable[k].name for k in self.model.layout.personal]
        names += [f"extra state {k}" for k in range(len(self._extra))]
        for i, values in enumerate(personal_states):
            values = list(values)
            if len(values) != len(template):
                raise ValueError(f"personal state {i} has {len(values)} tensors; this process's "
                                 f"has {len(template)}")
            for name, ref, value in zip(names, template, values):
                if tuple(np.shape(value)) != ref.shape:
                    raise ValueError(f"personal state {i}: {name} must have shape {ref.shape}, "
                                     f"got {tuple(np.shape(value))}")

    def next(self, state, client_data, personal_states) -> PersonalizedOutput:
        """One communication round (the kind `round_name(state)` says) on the clients' data."""
        self.check_personal(client_data, personal_states)
        name = self.round_name(state)
        new_state, personal, metrics = self.rounds[name](state, client_data,
                                                         list(personal_states))
        return PersonalizedOutput(new_state, list(personal), self._metrics(name, metrics))


def alternating(first: str, second: str, switch: int | None = None,
                after: str | None = None) -> Callable[[int], str]:
    """t ↦ `first` for even t, `second` for odd t; from t = `switch` on, `after`."""

    def schedule(t: int) -> str:
        if switch is not None and t >= switch:
            return after
        return first if t % 2 == 0 else second

    return schedule


def constant(name: str) -> Callable[[int], str]:
    return lambda t: name
