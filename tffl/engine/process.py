"""`Process`: the one process class of every algorithm, Keras or linear, stateless or personalized.

A process is an algorithm's round kinds (`rounds`: {name: federated computation of one
communication round}, all of one state type) and a schedule `t ↦ round kind` (t = communication
rounds done). Its contract is TFF's:

- **stateless** (`personal is None`): a `tff.learning.templates.LearningProcess`, checked by
  TFF's own constructor: `initialize: () -> S@SERVER`, `next: (S@SERVER, {D*}@CLIENTS) ->
  LearningProcessOutput(S@SERVER, metrics@SERVER)`, `get_model_weights: S -> W`,
  `set_model_weights: <S, W> -> S`, all `tff.Computation`s, so `tff.learning.programs.
  train_model` runs it unchanged;
- **personalized** (`personal` a `PersonalSpec`, the named declaration of one client's
  personal state): the same class and methods, with `next` the stateful-clients computation
  `(S@SERVER, {D*}@CLIENTS, P@CLIENTS) -> PersonalizedOutput(S@SERVER, P@CLIENTS,
  metrics@SERVER)` (`tffl.engine.personal_state`), checked here; TFF's two-argument checks
  do not apply to it, and its `initialize` refuses TFF's training program (one line naming
  `tffl.runtime.personalized_program`, the program logic that carries the personal states).

`next` runs one cycle of the schedule: the round itself for one kind, else the cycle composed by
`tffl.engine.schedules` (RoLoRA: the B round then the A round, each on its own data,
`data_names`; with `shared_cycle_data`, every round on the same clients' data, as RoLoRA's
Alt-min-GD needs). `next_round(state, data[, personal])` runs the single
communication round `round_name(state)` names, after checking the data and personal states in
Python (one-line errors), and is what `tffl.simulation.driver.run_rounds` calls.

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
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication
from tffl.engine import schedules
from tffl.engine.personal_state import PersonalizedOutput, check_program_carries_personal_states


@dataclasses.dataclass(frozen=True)
class PersonalSpec:
    """One client's personal state, declared: tensor `names`, their `shapes` and `dtypes`, and
    `initial(client_id)`, a client's state before it first trains. `keyed`: the value is an
    `OrderedDict(name=array)` (else a list in `names`' order)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    initial: Callable[[str], Any]
    keyed: bool = False

    @property
    def type(self) -> tff.Type:
        """The TFF type of one client's personal state (`P` of `next`)."""
        tensors = [tff.TensorType(d, s) for d, s in zip(self.dtypes, self.shapes)]
        if self.keyed:
            return tff.StructWithPythonType(list(zip(self.names, tensors)),
                                            collections.OrderedDict)
        return tff.types.to_type(tensors)

    def values(self, personal) -> list:
        """The tensors of one personal state, in `names`' order."""
        return [personal[n] for n in self.names] if self.keyed else list(personal)

    def initialize(self, client_id: str) -> Any:
        """Client `client_id`'s initial personal state (checked against the declaration)."""
        personal = self.initial(client_id)
        self.check([personal], what=f"initial personal state of client {client_id!r}")
        return personal

    def check(self, personal_states: Sequence[Any], count: int | None = None,
              what: str = "personal state") -> None:
        """ValueError naming the client and tensor unless there are `count` states (when given),
        each with this declaration's tensors and shapes."""
        personal_states = list(personal_states)
        if count is not None and len(personal_states) != count:
            raise ValueError(f"{count} client datasets but {len(personal_states)} personal "
                             "states: pass one personal state per client, in order")
        for i, personal in enumerate(personal_states):
            try:
                values = self.values(personal)
            except (KeyError, TypeError) as e:
                raise ValueError(f"{what} {i}: expected tensors {list(self.names)}, got "
                                 f"{type(personal).__name__} ({e})") from None
            if len(values) != len(self.names):
                raise ValueError(f"{what} {i} has {len(values)} tensors; this process's has "
                                 f"{len(self.names)} ({', '.join(self.names)})")
            for name, shape, value in zip(self.names, self.shapes, values):
                if tuple(np.shape(value)) != tuple(shape):
                    raise ValueError(f"{what} {i}: {name} must have shape {tuple(shape)}, got "
                                     f"{tuple(np.shape(value))}")


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
      personal: the declared personal state (None: stateless).
      shared_cycle_data: `next` gives every round of its cycle the same clients and data,
        `next(S, {D}@CLIENTS)` (`data_names` None); default each round its own.
    """

    algorithm: str
    initialize: tff.Computation
    rounds: Mapping[str, tff.Computation]
    get_model_weights: tff.Computation
    set_model_weights: tff.Computation
    schedule: Any = None
    personal: PersonalSpec | None = None
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


class Process(tff.learning.templates.LearningProcess):
    """An algorithm's round kinds and schedule (see the module docstring), built from its
    `ProcessParts` and what it reads beside them (`ProcessSupport`)."""

    def __init__(self, parts: ProcessParts, support: ProcessSupport = ProcessSupport()):
        self.algorithm, self.personal = parts.algorithm, parts.personal
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
        next_fn = self._compose_next()
        checked_set = CheckedComputation(parts.set_model_weights,
                                         lambda state, weights: self.check_model_weights(weights))
        if self.personal is None:
            super().__init__(parts.initialize, next_fn, parts.get_model_weights, checked_set)
            return
        refusing = CheckedComputation(  # TFF's train_model would drop the personal states
            parts.initialize, lambda: check_program_carries_personal_states(self.algorithm))
        tff.templates.IterativeProcess.__init__(self, refusing, next_fn)
        _personalized_next(next_fn, self.personal)
        self._get_model_weights, self._set_model_weights = parts.get_model_weights, checked_set
        self._get_hparams_fn = self._set_hparams_fn = None

    def _compose_next(self) -> tff.Computation:
        if len(self.rounds) == 1:
            return next(iter(self.rounds.values()))
        if self.personal is None:
            return schedules.compose_cycle(self.rounds, self.cycle, self.shared_cycle_data)
        return schedules.compose_personalized_cycle(self.rounds, self.cycle,
                                                    self.shared_cycle_data)

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

    def model_weights(self, state, personal=None):
        """The whole model's weights as numpy (Keras: the state's federated ones, the frozen
        base and the personal values if given), else `get_model_weights(state)`."""
        if self.model is None:
            return self.get_model_weights(state)
        return self.model.full_weights(state.global_model_weights, personal)

    def with_model_weights(self, state, weights):
        """`state` with the federated part of the whole-model `weights` (Keras algorithms;
        `FederatedModel.global_from_full` checks them)."""
        if self.model is None:
            return self.set_model_weights(state, weights)
        return self._set_model_weights(state, self.model.global_from_full(weights))

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
