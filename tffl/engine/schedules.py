"""Schedules of round kinds and the cycles TFF's `next` runs.

A schedule is `t ↦ round kind` (t = communication rounds done). A periodic one has a `cycle`,
the kinds of one period; `compose_cycle` makes one federated computation of a cycle, which is
what a `tffl.engine.process.Process`'s `next` is for RoLoRA:

    next(state, {<b_round=D*, a_round=D*>}@CLIENTS)
      = a_round(b_round(state, data.b_round).state, data.a_round)      (states)

each communication round on its own clients' data; with `shared_data` (RoLoRA's Alt-min-GD),
`next(state, D@CLIENTS)` gives every round the same clients' data. Its metrics keep TFF's
structure (`client_work/train`: loss and accuracy over both rounds' examples, or a linear
round's mean loss; `distributor`, `aggregator`, `finalizer` stacked per round;
`finalizer/round_kind`: the kinds, in order).

>>> schedule = alternating("b_round", "a_round")
>>> [schedule(t) for t in range(4)], cycle_of(schedule)
(['b_round', 'a_round', 'b_round', 'a_round'], ('b_round', 'a_round'))
>>> cycle_of(alternating("b_round", "a_round", switch=3, after="b_round")) is None
True
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine.personal_state import PersonalizedOutput


def alternating(first: str, second: str, switch: int | None = None,
                after: str | None = None) -> Callable[[int], str]:
    """t ↦ `first` for even t, `second` for odd t; from t = `switch` on, `after`. Without a
    switch the schedule is periodic: its `cycle` is `(first, second)`."""

    def schedule(t: int) -> str:
        if switch is not None and t >= switch:
            return after
        return first if t % 2 == 0 else second

    schedule.cycle = (first, second) if switch is None else None
    return schedule


def constant(name: str) -> Callable[[int], str]:
    def schedule(t: int) -> str:
        del t
        return name

    schedule.cycle = (name,)
    return schedule


def cyclic(kinds: Sequence[str]) -> Callable[[int], str]:
    """t ↦ `kinds[t mod E]`, E = len(kinds): the periodic schedule whose `cycle` is `kinds`.

    >>> schedule = cyclic(["b_round", "b_round", "a_round"])
    >>> [schedule(t) for t in range(4)], cycle_of(schedule)
    (['b_round', 'b_round', 'a_round', 'b_round'], ('b_round', 'b_round', 'a_round'))
    """
    kinds = tuple(kinds)
    if not kinds:
        raise ValueError("a cyclic schedule needs at least one round kind")

    def schedule(t: int) -> str:
        return kinds[t % len(kinds)]

    schedule.cycle = kinds
    return schedule


def cycle_of(schedule: Callable[[int], str]) -> tuple[str, ...] | None:
    """The round kinds of one period of `schedule` (None if it is not periodic)."""
    return getattr(schedule, "cycle", None)


def cycle_data_names(kinds: Sequence[str]) -> list[str]:
    """The names of a cycle's per-exchange client data: the round kinds (if distinct)."""
    return list(kinds) if len(set(kinds)) == len(kinds) else [
        f"round_{i}" for i in range(len(kinds))]


def _nested(value, value_type: tff.Type):
    """A struct value inside a TF computation as nested OrderedDicts/lists, read off its type."""
    if not isinstance(value_type, tff.StructType):
        return value
    items = [(name, _nested(value[i], t)) for i, (name, t) in enumerate(tff.structure.iter_elements(value_type))]
    if all(name is not None for name, _ in items):   # named, or empty: TFF's `OrderedDict()`
        return collections.OrderedDict(items)
    return [v for _, v in items]


def _combine_train(trains: Sequence[Mapping]) -> collections.OrderedDict:
    """One `client_work/train` of a cycle's E rounds: a Keras round's weighted by
    `num_examples` (which sums: every round's examples); a linear round's (`loss`,
    `num_clients`: no examples) the mean over the rounds, with `num_clients` the largest
    round's (the clients of a cycle on shared data, where every round has the same ones)."""
    train = collections.OrderedDict()
    if "num_examples" not in trains[0]:
        for key in trains[0]:
            values = tf.stack([t[key] for t in trains])
            train[key] = (tf.reduce_max(values) if key == "num_clients"
                          else tf.reduce_mean(values))
        return train
    total = tf.add_n([t["num_examples"] for t in trains])
    for key in trains[0]:
        train[key] = total if key == "num_examples" else tf.math.divide_no_nan(
            tf.add_n([t[key] * t["num_examples"] for t in trains]), total)
    return train


def _combine_metrics(kinds: Sequence[str], metrics_type: tff.StructType):
    """TF computation: a cycle's per-round metrics (a struct of E structures of TFF's kind)
    -> one: `client_work/train` over all rounds (`_combine_train`), the others stacked per
    round along a new first axis, and `finalizer/round_kind`, the E round kinds."""

    @tff.tensorflow.computation(metrics_type)
    def combine(metrics):
        metrics = _nested(metrics, metrics_type)
        train = _combine_train([m["client_work"]["train"] for m in metrics])

        def stacked(key):
            return tf.nest.map_structure(lambda *xs: tf.stack(xs), *[m[key] for m in metrics])

        finalizer = collections.OrderedDict(round_kind=tf.constant(list(kinds)))
        finalizer.update(stacked("finalizer"))
        return collections.OrderedDict(
            distributor=stacked("distributor"),
            client_work=collections.OrderedDict(train=train),
            aggregator=stacked("aggregator"), finalizer=finalizer)

    return combine


def _cycle_parts(rounds: Mapping[str, tff.Computation], kinds: Sequence[str],
                 shared_data: bool):
    """(the cycle's client data type, its data names (None: shared data), the metrics
    combiner) of `kinds`.

    Raises:
      ValueError: the rounds' metrics differ in structure (they could not be stacked).
    """
    data_type = rounds[kinds[0]].type_signature.parameter[1]
    names = None if shared_data else cycle_data_names(kinds)
    cycle_type = data_type if shared_data else tff.FederatedType(
        tff.StructType([(n, data_type.member) for n in names]), tff.CLIENTS)
    metric_types = [rounds[k].type_signature.result.metrics.member for k in kinds]
    if any(not t.is_equivalent_to(metric_types[0]) for t in metric_types[1:]):
        raise ValueError(f"round kinds {list(kinds)} report metrics of different structures; a "
                         "cycle stacks them per round, so they must agree")
    return cycle_type, names, _combine_metrics(kinds, tff.StructType(metric_types))


def _round_data(data, names, e):
    """The client data of a cycle's e-th round: its own entry, or all of it when shared."""
    return data if names is None else data[names[e]]


def compose_cycle(rounds: Mapping[str, tff.Computation], kinds: Sequence[str],
                  shared_data: bool = False):
    """One federated computation running the communication rounds `kinds` in turn, each on its
    own clients' data: `next(state, {<kind_1=D*, ..., kind_E=D*>}@CLIENTS) -> (state, metrics)`
    with the metrics of `_combine_metrics`. It equals calling `rounds[kind_e]` E times in order
    (the same state type in and out). With `shared_data`, `next(state, D@CLIENTS)` gives every
    round the same clients and data (an algorithm whose exchanges must reach the same clients,
    as RoLoRA's Alt-min-GD's). The cycle cannot be one MapReduceForm (its second broadcast
    depends on the first aggregate), so bytes stay per communication round (`Process.traffic`,
    read off each round's own computation).

    Raises:
      ValueError: the rounds' metrics differ in structure (they could not be stacked).
    """
    state_type = rounds[kinds[0]].type_signature.parameter[0]
    cycle_type, names, combine = _cycle_parts(rounds, kinds, shared_data)

    @tff.federated_computation(state_type, cycle_type)
    def next_fn(state, data):
        metrics = []
        for e, kind in enumerate(kinds):
            output = rounds[kind](state, _round_data(data, names, e))
            state = output.state
            metrics.append(output.metrics)
        return tff.learning.templates.LearningProcessOutput(
            state, tff.federated_map(combine, tff.federated_zip(metrics)))

    return next_fn


def compose_personalized_cycle(rounds: Mapping[str, tff.Computation], kinds: Sequence[str],
                               shared_data: bool = False):
    """`compose_cycle` for rounds with personal state at CLIENTS: `next(state,
    {<kind_1=D*, ...>}@CLIENTS (or D@CLIENTS with `shared_data`), personal@CLIENTS) ->
    PersonalizedOutput(state, personal@CLIENTS, metrics)`, each round starting from the previous
    one's state and personal states.

    Raises:
      ValueError: the rounds' metrics differ in structure.
    """
    state_type, _, personal_type = rounds[kinds[0]].type_signature.parameter
    cycle_type, names, combine = _cycle_parts(rounds, kinds, shared_data)

    @tff.federated_computation(state_type, cycle_type, personal_type)
    def next_fn(state, data, personal):
        metrics = []
        for e, kind in enumerate(kinds):
            output = rounds[kind](state, _round_data(data, names, e), personal)
            state, personal = output.state, output.personal_states
            metrics.append(output.metrics)
        return PersonalizedOutput(state, personal,
                                  tff.federated_map(combine, tff.federated_zip(metrics)))

    return next_fn
