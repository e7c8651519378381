"""`Process`: the one process class of every algorithm, Keras or linear, stateless or
personalized, and `build_process`, its one builder.

A process is an algorithm's round kinds (`rounds`: {name: federated computation of one
communication round}, all of one state type, composed by `tffl.engine.composition`) and a
schedule `t ↦ round kind` (t = communication rounds done). Every process declares its clients'
personal state (a `tffl.engine.personal_state.PersonalSpec`, `NO_PERSONAL_STATE` when there is
none), and what it claims to be follows from it:

- **stateless** (the empty spec; `personal` is None): a `StatelessProcess`, which is a
  `tff.learning.templates.LearningProcess` built through that class's constructor (so TFF
  checks it): `initialize: () -> S@SERVER`, `next: (S@SERVER, {D*}@CLIENTS) ->
  LearningProcessOutput(S@SERVER, metrics@SERVER)`, `get_model_weights: S -> W`,
  `set_model_weights: <S, W> -> S`, all `tff.Computation`s, so `tff.learning.programs.
  train_model` runs it unchanged;
- **personalized** (a non-empty spec, `personal`): a `Process`, a `tff.templates.IterativeProcess`
  built through `IterativeProcess`'s constructor, whose `next` is the stateful-clients
  computation `(S@SERVER, {D*}@CLIENTS, P@CLIENTS) -> PersonalizedOutput(S@SERVER,
  P@CLIENTS, metrics@SERVER)` (`tffl.engine.personal_state`). It is not a `LearningProcess`:
  TFF's `LearningProcess` constructor requires a two-argument `next` returning a
  `LearningProcessOutput`, which cannot carry the personal states back. It has the same
  `get_model_weights`/`set_model_weights` computations and every other method of the class,
  and its `initialize` refuses TFF's training program (one line naming
  `tffl.runtime.personalized_program`, the program logic that carries the personal states).

`next` runs one cycle of the schedule: the round itself for one kind, else the cycle composed by
`tffl.engine.composition.compose_cycle` (RoLoRA: the B round then the A round, each on its own
data, `data_names`; with `shared_cycle_data`, every round on the same clients' data, as RoLoRA's
Alt-min-GD needs). `next_round(state, data[, personal])` runs the single communication round
`round_name(state)` names, after checking the data and personal states in Python (one-line
errors), and is what `tffl.simulation.driver.run_rounds` calls.

Bytes per client: `traffic` ({round kind: `RoundTraffic`}, read off TFF's forms where they hold
the round, else the declared figures) and `client_traffic(round_name, client_ids)`, the mean over
the round's clients (heterogeneous ranks differ by client).

Example:

>>> with runtime.local_runtime():                       # `process`: RoLoRA
...     state = process.initialize()
...     first = process.round_name(state)
...     state = process.next_round(state, datasets).state     # one B round
...     second = process.round_name(state)
>>> first, second, process.personal is None
('b_round', 'a_round', True)
>>> isinstance(process, tff.learning.templates.LearningProcess)
True
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication
from tffl.engine import composition
from tffl.engine import schedules
from tffl.engine.personal_state import (
    NO_PERSONAL_STATE, PersonalizedOutput, PersonalSpec, check_program_carries_personal_states)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """How a process is evaluated, passed to it when it is built.

    `computation`: `(W@SERVER, [P@CLIENTS,] train@CLIENTS, test@CLIENTS) -> metrics@SERVER`
    (the personal states only for a personalized process); `final_computation`: the same
    signature for a final fine-tuning round (FLUTE's), or None; `personal_indices`: the
    personal variables' positions in the model's trainable variables; `finetune_epochs`: E_ft.
    """

    computation: tff.Computation
    final_computation: tff.Computation | None = None
    personal_indices: tuple[int, ...] = ()
    finetune_epochs: int = 0


class CheckedComputation(tff.framework.ConcreteComputation):
    """A `tff.Computation` that runs `check(*args)` on concrete (non-traced) arguments before it
    is invoked, for one-line errors naming the variable instead of TFF's type mismatch."""

    def __init__(self, computation: tff.framework.ConcreteComputation,
                 check: Callable[..., None]):
        super().__init__(computation_proto=computation.get_proto(computation),
                         context_stack=computation._context_stack,  # noqa: SLF001
                         annotated_type=computation.type_signature)
        self._check = check

    def __call__(self, *args, **kwargs):
        if not any(isinstance(a, tff.Value) for a in (*args, *kwargs.values())):
            self._check(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def _personalized_next(next_fn: tff.Computation, personal: PersonalSpec) -> None:
    """TypeError unless `next_fn` follows the stateful-clients signature with `personal`'s type."""
    signature = next_fn.type_signature
    params, result = signature.parameter, signature.result
    ok = (isinstance(params, tff.StructType) and len(params) == 3
          and params[1].placement is tff.CLIENTS and params[2].placement is tff.CLIENTS
          and params[2].member.is_equivalent_to(personal.type)
          and isinstance(result, tff.StructType) and len(result) == 3
          and result[1].placement is tff.CLIENTS and result[2].placement is tff.SERVER)
    if not ok:
        raise TypeError("a personalized process's next must be (S@SERVER, D@CLIENTS, "
                        "P@CLIENTS) -> (S@SERVER, P@CLIENTS, metrics@SERVER) with P = "
                        f"{personal.type}; got {signature}")


def _check_against_type(value, value_type: tff.Type, path: str) -> None:
    """ValueError naming the entry unless `value`'s tensors have `value_type`'s shapes."""
    if isinstance(value_type, tff.TensorType):
        expected = tuple(value_type.shape or ())
        if tuple(np.shape(value)) != expected:
            raise ValueError(f"{path} must have shape {expected}, got {tuple(np.shape(value))}")
        return
    if isinstance(value_type, tff.StructType):
        elements = tff.structure.to_elements(value_type)
        for i, (name, member) in enumerate(elements):
            try:
                item = value[name] if name is not None and isinstance(value, Mapping) else value[i]
            except (KeyError, IndexError, TypeError):
                raise ValueError(f"{path} has no entry {name or i}") from None
            _check_against_type(item, member, f"{path}/{name or i}")


@dataclasses.dataclass(frozen=True)
class ProcessParts:
    """The TFF computations and schedule a `Process` is made of.

    Attributes:
      algorithm: the algorithm's name (as in `tffl.algorithms.registry.ALGORITHMS`).
      initialize: `() -> S@SERVER`.
      rounds: {round kind: one communication round}, each of `next`'s form (one cycle of a
        schedule with several kinds is composed from them).
      get_model_weights, set_model_weights: `S -> W` and `<S, W> -> S`.
      schedule: `t ↦ round kind` (`tffl.engine.schedules`); default: the one kind.
      personal: the clients' declared personal state (`NO_PERSONAL_STATE`, or None: none).
      shared_cycle_data: `next` gives every round of its cycle the same clients and data,
        `next(S, {D}@CLIENTS)` (`data_names` None); default each round its own.
    """

    algorithm: str
    initialize: tff.Computation
    rounds: Mapping[str, tff.Computation]
    get_model_weights: tff.Computation
    set_model_weights: tff.Computation
    schedule: Any = None
    personal: PersonalSpec | None = NO_PERSONAL_STATE
    shared_cycle_data: bool = False


@dataclasses.dataclass(frozen=True)
class ProcessSupport:
    """What a `Process` reads beside its computations.

    Attributes:
      declared_traffic: {round kind: `RoundTraffic`} for rounds TFF's forms cannot hold.
      traffic_rounds: `() -> {round kind: computation}` that `traffic` sizes (default the
        process's rounds), e.g. the rounds without a simulation-only diagnostic.
      client_traffic: `(round kind, client id) -> RoundTraffic` when clients differ.
      model: the `tffl.engine.federated_model.FederatedModel` (Keras algorithms), else None.
      evaluation: how the process is evaluated (`Evaluation`), else None.
      check_data: `client_data -> None`, raising ValueError on malformed client data.
      hook: the Keras client work's `tffl.engine.client_hooks.ClientHook`, else None.
      config: the algorithm's typed configuration, for the record.
    """

    declared_traffic: Mapping[str, communication.RoundTraffic] | None = None
    traffic_rounds: Any = None
    client_traffic: Any = None
    model: Any = None
    evaluation: Evaluation | None = None
    check_data: Any = None
    hook: Any = None
    config: Any = None


class Process(tff.templates.IterativeProcess):
    """An algorithm's round kinds and schedule (see the module docstring), built from its
    `ProcessParts` and what it reads beside them (`ProcessSupport`).

    Constructed, this class is a personalized process: a `tff.templates.IterativeProcess` built
    through `IterativeProcess`'s constructor, with a three-argument `next`. A process without
    personal state is a `StatelessProcess` (a TFF `LearningProcess`); `Process.of(parts,
    support)` builds whichever `parts.personal` asks for."""

    def __init__(self, parts: ProcessParts, support: ProcessSupport = ProcessSupport()):
        if not parts.personal:
            raise TypeError(f"{parts.algorithm} keeps no personal state: build it as a "
                            "StatelessProcess (a TFF LearningProcess), e.g. with Process.of")
        next_fn = self._assemble(parts, support)
        refusing = CheckedComputation(  # TFF's train_model would drop the personal states
            parts.initialize, lambda: check_program_carries_personal_states(self.algorithm))
        super().__init__(refusing, next_fn)
        _personalized_next(next_fn, self.personal)

    @classmethod
    def of(cls, parts: ProcessParts, support: ProcessSupport = ProcessSupport()) -> Process:
        """The process of `parts`: a `StatelessProcess` when it declares no personal state,
        else a (personalized) `Process`."""
        return (Process if parts.personal else StatelessProcess)(parts, support)

    def _assemble(self, parts: ProcessParts, support: ProcessSupport) -> tff.Computation:
        """Sets what every process holds; returns `next` (one cycle of the schedule)."""
        self.algorithm = parts.algorithm
        self.personal = parts.personal or None   # None: no personal state
        self.model, self.evaluation = support.model, support.evaluation
        self.hook, self.config = support.hook, support.config
        self.rounds = collections.OrderedDict(parts.rounds)
        self.schedule = parts.schedule or schedules.constant(next(iter(self.rounds)))
        self.declared_traffic = collections.OrderedDict(support.declared_traffic or {})
        self._traffic_rounds, self._traffic = support.traffic_rounds, None
        self._client_traffic = support.client_traffic
        self._check_data = support.check_data or (lambda data: None)
        self.cycle = schedules.cycle_of(self.schedule)
        if self.cycle is None and len(self.rounds) > 1:
            raise ValueError(f"{self.algorithm}: {len(self.rounds)} round kinds need a periodic "
                             "schedule (`tffl.engine.schedules.alternating`) to form `next`")
        self.shared_cycle_data = parts.shared_cycle_data
        self.data_names = (None if len(self.rounds) == 1 or self.shared_cycle_data
                           else tuple(schedules.cycle_data_names(self.cycle)))
        self._weights = (parts.get_model_weights, CheckedComputation(
            parts.set_model_weights, lambda state, weights: self.check_model_weights(weights)))
        self._store_weights = parts.set_model_weights   # unchecked: `with_model_weights` checks
        if len(self.rounds) == 1:
            return next(iter(self.rounds.values()))
        return composition.compose_cycle(self.rounds, self.cycle,
                                         parts.personal or NO_PERSONAL_STATE,
                                         self.shared_cycle_data)

    @property
    def get_model_weights(self) -> tff.Computation:
        """`S -> W`: the state's model weights (a TF computation)."""
        return self._weights[0]

    @property
    def set_model_weights(self) -> tff.Computation:
        """`<S, W> -> S` with those model weights (checked first: one line naming the
        variable)."""
        return self._weights[1]

    # The schedule.

    @staticmethod
    def round_num(state) -> int:
        """Communication rounds done (the finalizer's counter, or the state's `round_num`)."""
        counter = state.finalizer if hasattr(state, "finalizer") else state
        return int(np.asarray(counter["round_num"]))

    def round_name(self, state) -> str:
        """The round kind the next communication round runs.

        Raises:
          FileNotFoundError: the frozen-weights file the clients read is gone (e.g. a cleaned
            cache), naming it, instead of an error from inside the worker.
        """
        if self.model is not None:
            self.model.frozen.check_readable()
        if len(self.rounds) == 1:
            return next(iter(self.rounds))
        name = self.schedule(self.round_num(state))
        if name not in self.rounds:
            raise ValueError(f"schedule of {self.algorithm} chose {name!r}, not one of "
                             f"{list(self.rounds)}")
        return name

    def next_round(self, state, client_data, personal_states=None):
        """One communication round, of the kind `round_name(state)` says, on `client_data` (and,
        for a personalized process, the clients' `personal_states`, one per client, in order),
        both checked first. Returns a `LearningProcessOutput` (stateless) or a
        `PersonalizedOutput`; metrics are `{kind: metrics}` when the process has several."""
        self._check_data(client_data)
        name = self.round_name(state)
        if self.personal is None:
            if personal_states is not None:
                raise ValueError(f"{self.algorithm} keeps no personal state; call "
                                 "next_round(state, client_data)")
            output = self.rounds[name](state, client_data)
            return tff.learning.templates.LearningProcessOutput(
                output.state, self._metrics(name, output.metrics))
        if personal_states is None:
            raise ValueError(f"{self.algorithm} keeps a personal state per client; call "
                             "next_round(state, client_data, personal_states)")
        personal_states = list(personal_states)
        self.personal.check(personal_states, count=len(client_data))
        new_state, personal, metrics = self.rounds[name](state, client_data, personal_states)
        return PersonalizedOutput(new_state, list(personal), self._metrics(name, metrics))

    def _metrics(self, name, metrics):
        return collections.OrderedDict([(name, metrics)]) if len(self.rounds) > 1 else metrics

    def initialize_personal(self, client_id: str) -> Any:
        """Client `client_id`'s personal state before it first trains."""
        if self.personal is None:
            raise ValueError(f"{self.algorithm} keeps no personal state")
        return self.personal.initialize(client_id)

    # Bytes per client.

    @property
    def traffic(self) -> Mapping[str, communication.RoundTraffic]:
        """{round kind: bytes down/up per client}, read off TFF's DistributeAggregateForm (or
        MapReduceForm) of each round, which counts what the aggregator really moves; for rounds
        neither form can hold (personal state returned at CLIENTS), the declared figures (None
        when the builder declared none)."""
        if self._traffic is None:
            traffic = collections.OrderedDict()
            rounds = self._traffic_rounds() if self._traffic_rounds else self.rounds
            for name, computation in rounds.items():
                try:
                    traffic[name] = communication.round_traffic(computation)
                except ValueError:
                    traffic[name] = self.declared_traffic.get(name)   # None: not known
            self._traffic = traffic
        return self._traffic

    def client_traffic(self, round_name: str, client_ids: Sequence[str] = ()
                       ) -> communication.RoundTraffic | None:
        """Mean bytes per client of `round_name` over `client_ids` (`traffic` when the clients
        do not differ or none are given; None if neither TFF's forms nor the builder know)."""
        if self._client_traffic is None or not client_ids:
            return self.traffic[round_name]
        each = [self._client_traffic(round_name, c) for c in client_ids]
        return communication.RoundTraffic(down=float(np.mean([t.down for t in each])),
                                          up=float(np.mean([t.up for t in each])))

    # Weights and evaluation.

    @property
    def frozen_fingerprint(self) -> str | None:
        """The fingerprint of the frozen weights the state belongs to (None: nothing frozen)."""
        return None if self.model is None else self.model.frozen.fingerprint

    @property
    def spec(self):
        return None if self.model is None else self.model.spec

    def check_model_weights(self, weights) -> None:
        """ValueError naming the variable if `weights` (`get_model_weights`' type) do not fit
        this process's model (e.g. LoRA factors of another rank)."""
        if self.model is not None:
            self.model.check_global_weights(weights)
        else:
            _check_against_type(weights, self.get_model_weights.type_signature.result,
                                "set_model_weights: model weights")

    def model_weights(self, state, personal=None, base_by_reference: bool = False):
        """The whole model's weights as numpy (Keras: the state's federated ones, the frozen
        base and the personal values if given; `base_by_reference`: the base as
        `tffl.engine.frozen.FrozenValue`s, read where used), else `get_model_weights(state)`."""
        if self.model is None:
            return self.get_model_weights(state)
        return self.model.full_weights(state.global_model_weights, personal, base_by_reference)

    def with_model_weights(self, state, weights):
        """`state` with the federated part of the whole-model `weights` (Keras algorithms;
        `FederatedModel.global_from_full` checks them)."""
        if self.model is None:
            return self.set_model_weights(state, weights)
        return self._store_weights(state, self.model.global_from_full(weights))

    def evaluate(self, state, train_data, test_data, personal_states=None) -> dict[str, float]:
        """Test metrics over the given clients (`Evaluation.computation`); a personalized
        process's client i uses `personal_states[i]`."""
        return self._evaluate(self._evaluation().computation, state, train_data, test_data,
                              personal_states)

    def evaluate_final(self, state, train_data, test_data, personal_states=None
                       ) -> dict[str, float]:
        """The final fine-tuning round (FLUTE's `final_head_epochs` > 0), then `evaluate`'s
        metrics; neither the state nor the personal states change."""
        final = self._evaluation().final_computation
        if final is None:
            raise ValueError(f"{self.algorithm} has no final fine-tuning round (FLUTE's "
                             "final_head_epochs > 0 builds one)")
        return self._evaluate(final, state, train_data, test_data, personal_states)

    def _evaluation(self) -> Evaluation:
        if self.evaluation is None:
            raise ValueError(f"{self.algorithm} was built without an evaluation")
        return self.evaluation

    def _evaluate(self, computation, state, train_data, test_data, personal_states):
        if len(train_data) != len(test_data):
            raise ValueError(f"{len(train_data)} training but {len(test_data)} test datasets: "
                             "evaluation needs both for every client, in the same order")
        weights = self.get_model_weights(state)
        if self.personal is None:
            metrics = computation(weights, train_data, test_data)
        else:
            self.personal.check(list(personal_states or ()), count=len(train_data))
            metrics = computation(weights, list(personal_states), train_data, test_data)
        return {k: float(v) for k, v in metrics.items()}


class StatelessProcess(Process, tff.learning.templates.LearningProcess):
    """A process without personal state: a `tff.learning.templates.LearningProcess` built
    through that class's constructor (TFF checks its four computations), with every method of
    `Process`."""

    def __init__(self, parts: ProcessParts, support: ProcessSupport = ProcessSupport()):
        if parts.personal:
            raise TypeError(f"{parts.algorithm} keeps a personal state per client: a "
                            "StatelessProcess cannot carry it (build a Process)")
        next_fn = self._assemble(parts, support)
        tff.learning.templates.LearningProcess.__init__(
            self, parts.initialize, next_fn, self.get_model_weights, self.set_model_weights)


@dataclasses.dataclass(frozen=True)
class Federated:
    """What every round kind of an algorithm shares beside its pieces.

    Attributes:
      initial_weights: `() -> w⁰`, the federated weights' initial value (a no-argument TF
        computation; its result type is w's).
      data_type: one client's data's type (unplaced): a `tf.data` sequence of batches, or the
        linear algorithms' tensors.
      personal: the clients' personal state (`NO_PERSONAL_STATE`: none).
      stored: `w -> w`, a TF function `set_model_weights` applies (e.g. FedRep's QR); None:
        w is stored as given.
    """

    initial_weights: tff.Computation
    data_type: tff.Type
    personal: PersonalSpec = NO_PERSONAL_STATE
    stored: Callable | None = None


def build_process(algorithm: str, pieces: Sequence, federated: Federated, schedule=None,
                  support: ProcessSupport = ProcessSupport(),
                  shared_cycle_data: bool = False) -> Process:
    """The one process builder: `algorithm`'s round kinds (`pieces`,
    `tffl.engine.rounds.RoundPieces`) composed with one shared state by
    `tffl.engine.composition.compose_kinds`, run by `schedule` (default: the one kind).

    Args:
      algorithm: the algorithm's name.
      pieces: its round kinds' pieces.
      federated: the weights, data and personal state the kinds share (`Federated`).
      schedule: `t ↦ round kind` (`tffl.engine.schedules`); several kinds need a periodic one.
      support: what the process reads beside its computations (`ProcessSupport`); its
        `declared_traffic` defaults to the pieces' own.
      shared_cycle_data: `next` gives every round of its cycle the same clients' data.

    Returns:
      A `StatelessProcess` (a TFF `LearningProcess`) when `federated.personal` is empty, else a
      personalized `Process`.
    """
    initialize, rounds = composition.compose_kinds(pieces, federated.initial_weights,
                                                   federated.data_type, federated.personal)
    get_weights, set_weights = composition.weights_computations(
        initialize.type_signature.result.member, federated.stored)
    if support.declared_traffic is None:
        support = dataclasses.replace(
            support, declared_traffic={p.name: p.traffic for p in pieces})
    return Process.of(ProcessParts(
        algorithm, initialize, rounds, get_model_weights=get_weights,
        set_model_weights=set_weights, schedule=schedule, personal=federated.personal,
        shared_cycle_data=shared_cycle_data), support)
