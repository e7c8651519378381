"""Processes: an algorithm's round kinds, composed with one shared state
(`tffl.engine.composition`), run by a schedule (`tffl.engine.schedules`).

All kinds share one state type and one `initialize`, and the algorithm is
`schedule: t ↦ round name` (t = communication rounds done, the finalizer's `round_num`):

| algorithm    | schedule                                                      | cycle        |
|--------------|---------------------------------------------------------------|--------------|
| one kind     | t ↦ that kind                                                 | (kind,)      |
| RoLoRA       | t ↦ `b_round` if t is even else `a_round`                      | (b, a)       |
| RoLoRA→FFA   | as RoLoRA while t < switch, then `b_round`                     | none         |

`next_round(state, data)` runs ONE communication round (the kind the state's `round_num`
selects) on the data it is given, so every communication round gets its own client data; the
kinds' own computations, `process.rounds[name]`, are ordinary federated computations of
identical type.

Two process protocols:

- `ScheduledProcess`, a `tff.learning.templates.LearningProcess` whose `next` is a
  `tff.Computation` running one cycle: for one kind, that round; for RoLoRA,
  `compose_cycle`'s B round then A round, `next(state, {<b_round=D*, a_round=D*>}@CLIENTS)`,
  so `tff.learning.programs.train_model` runs it (with `runtime.ClientDataSource(...,
  data_names=process.data_names)`);
- `PersonalizedProcess` (`tffl.engine.personal_state`'s stateful clients):
  `next(state, data@CLIENTS, personal@CLIENTS) -> PersonalizedOutput(state, personal, metrics)`,
  a `tff.Computation` running one cycle (`schedules.compose_personalized_cycle` for several
  kinds), plus `initialize_personal(client_id)`; `next_round` checks the personal states and
  runs one communication round.

Both have `round_name(state)`, `next_round`, `traffic` ({round name: bytes per client}),
`model` (the `tffl.engine.rounds.FederatedModel`: frozen weights and their fingerprint) and
`model_weights(state)` (the whole model's weights, frozen ones included, as numpy).

Example:

>>> with runtime.local_runtime():                       # `process`: RoLoRA
...     state = process.initialize()
...     first = process.round_name(state)
...     state = process.next_round(state, datasets).state     # one B round
...     second = process.round_name(state)
>>> first, second
('b_round', 'a_round')
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication
from tffl.engine import composition
from tffl.engine import rounds as engine
from tffl.engine import schedules
from tffl.engine.composition import compose_personalized, compose_rounds  # noqa: F401  (public here)
from tffl.engine.personal_state import PersonalizedOutput



@runtime_checkable
class RoundProtocol(Protocol):
    """What `tffl.simulation.driver.run_rounds` reads from a process besides `initialize`: which
    round kind the next communication round is, `next_round` to run that one round (with the
    personal states for `PersonalizedProcess`), its bytes per client, and the fingerprint of the
    frozen weights the state belongs to. Both `ScheduledProcess` and `PersonalizedProcess`
    follow it (and so does any wrapper that forwards these attributes)."""

    traffic: Mapping[str, Any]
    frozen_fingerprint: str

    def round_name(self, state) -> str: ...

    def next_round(self, state, *data_and_personal) -> Any: ...


class Scheduled:
    """What both process protocols share: the schedule, the rounds, traffic and weights."""

    def _setup(self, algorithm: str, model: engine.FederatedModel,
               pieces: Sequence[engine.RoundPieces], rounds: Mapping[str, tff.Computation],
               schedule: Callable[[int], str], traffic_rounds=None):
        self.algorithm = algorithm
        self.model = model
        self.pieces = tuple(pieces)
        self.rounds = collections.OrderedDict(rounds)
        self.schedule = schedule
        # Bytes per client per round kind from the types the client work returns; `traffic`
        # refines them with TFF's own sizing of each round (`tffl.engine.communication.round_traffic`).
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
    groups = ((weights.trainable, weights.non_trainable) if hasattr(weights, "trainable")
              else tuple(weights))
    _check_infos((spec.trainable, spec.non_trainable), groups, "set_model_weights")


class ScheduledProcess(Scheduled, tff.learning.templates.LearningProcess):
    """A `LearningProcess` whose `next` (a `tff.Computation`) runs one cycle of the schedule.

    With one round kind the cycle is one communication round: `next` is that kind's federated
    computation itself. With a periodic schedule of several kinds (RoLoRA's B round then A
    round) `next` is `compose_cycle`'s computation: one communication round per kind, each on
    its own client data (`{<b_round=D*, a_round=D*>}@CLIENTS`), metrics in TFF's structure.
    `next_round(state, data)` runs the single communication round the state's `round_num`
    selects (what `tffl.simulation.driver` calls, with metrics `{kind: metrics}` for several kinds).
    """

    def __init__(self, algorithm, model, pieces, initialize, rounds, schedule,
                 traffic_rounds=None):
        self._setup(algorithm, model, pieces, rounds, schedule, traffic_rounds)
        kinds = schedules.cycle_of(schedule)
        if len(self.rounds) == 1:
            next_fn = next(iter(self.rounds.values()))
        elif kinds is not None:
            next_fn = schedules.compose_cycle(self.rounds, kinds)
        else:
            # No periodic cycle (RoLoRA→FFA switches once): `next` stays a Python method.
            next_fn = next(iter(self.rounds.values()))
        self.cycle = kinds
        # What `next` takes per client: one dataset for one round kind, else one per kind.
        self.data_names = (None if len(self.rounds) == 1 or kinds is None
                           else tuple(schedules.cycle_data_names(kinds)))
        get_model_weights, self._set_weights_computation = composition.weights_computations(initialize)
        super().__init__(initialize, next_fn, get_model_weights, self._set_weights_computation)

    @property
    def next(self):
        if len(self.rounds) == 1 or self.cycle is not None:
            return self._next_fn
        return self.next_round

    def next_round(self, state, client_data) -> tff.learning.templates.LearningProcessOutput:
        """One communication round, of the kind `round_name(state)` says."""
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
    """The stateful-clients protocol (`tffl.engine.personal_state`) on the engine's rounds.

    Attributes beyond `Scheduled`'s: `initialize` (a TFF computation), `get_model_weights`
    (the federated weights), `hook` (the algorithm's `engine.ClientHook`, e.g. FLUTE's).
    """

    def __init__(self, algorithm, model, pieces, initialize, rounds, schedule, hook=None):
        self._setup(algorithm, model, pieces, rounds, schedule)
        self.initialize = initialize
        self.hook = hook
        kinds = schedules.cycle_of(schedule)
        self.cycle = kinds
        if len(self.rounds) == 1:
            self._next_computation = next(iter(self.rounds.values()))
        elif kinds is not None:
            self._next_computation = schedules.compose_personalized_cycle(self.rounds, kinds)
        else:
            self._next_computation = None
        self.data_names = (None if len(self.rounds) == 1 or kinds is None
                           else tuple(schedules.cycle_data_names(kinds)))
        self.get_model_weights, self._set_weights_computation = composition.weights_computations(initialize)
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

    @property
    def next(self) -> tff.Computation:
        """`(state@S, data@C, personal@C) -> PersonalizedOutput(state@S, personal@C,
        metrics@S)`, a `tff.Computation` running one cycle of the schedule: with one round kind,
        that round; with RoLoRA-alternated adapters, the B round then the A round, each on its
        own data (`{<b_round=D*, a_round=D*>}@CLIENTS`, `data_names`), metrics in TFF's
        structure as `schedules.compose_cycle`'s."""
        return self._next_computation or self.next_round

    def next_round(self, state, client_data, personal_states) -> PersonalizedOutput:
        """One communication round (the kind `round_name(state)` says) on the clients' data,
        their personal states checked first (one per client, this process's shapes)."""
        self.check_personal(client_data, personal_states)
        name = self.round_name(state)
        new_state, personal, metrics = self.rounds[name](state, client_data,
                                                         list(personal_states))
        return PersonalizedOutput(new_state, list(personal), self._metrics(name, metrics))
