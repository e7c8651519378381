"""The one composer: an algorithm's round kinds (`tffl.engine.rounds.RoundPieces`) as federated
computations sharing one state, and the cycle of kinds a process's `next` runs.

Every round kind — Keras or linear, stateless or personalized, one exchange or two — is composed
by `compose_kinds` from TFF's four pieces, as `tff.learning.templates.compose_learning_process`
composes them: a distributor (TFF's `build_broadcast_process` of the federated weights w), the
kind's client work, an aggregator (a `tff.templates.AggregationProcess`, weighted or not) and a
finalizer (a `tff.learning.templates.FinalizerProcess` around the kind's server step). One round
of kind k over the clients I, with personal states p_i (none when the algorithm declares the
empty `NO_PERSONAL_STATE`):

    w → clients                                       (distributor, + the round's inputs)
    (ClientResult_i, sums_i, p_i') = client_update_k(w, data_i[, p_i][, inputs])
    ū = aggregator_k({update_i}[, {weight_i}])
    [r = second distributor_k(ū) → clients; p_i' = second client update_k(w, r, data_i, p_i')]
    w' = step_k(w, ū), measurements = measure_k(w, ū, t)          (finalizer; t + 1)

The aggregator and finalizer states are keyed by round kind and the finalizer counts `round_num`,
the communication rounds done, so all kinds share one state type and one `initialize`:

    LearningAlgorithmState(global_model_weights = w, distributor = (), client_work = (),
                           aggregator = {round: state},
                           finalizer = {round_num, steps: {round: server-step state}})

Its metrics have TFF's structure (`distributor`, `client_work/train`, `aggregator`,
`finalizer`), and its signature is TFF's `LearningProcess` `next` when the algorithm has no
personal state, `(S, D) -> LearningProcessOutput(S, metrics)`, else the stateful-clients
protocol `(S, D, P) -> PersonalizedOutput(S, P, metrics)` (`tffl.engine.personal_state`).

`compose_cycle` makes one federated computation of a cycle of kinds (RoLoRA's `next`: its B
round then its A round); `weights_computations` and `initialize_from_clients` are the state's
TF and federated helpers. `tffl.engine.process.build_process` makes a process of them.

>>> rounds, initialize = process.rounds, process.initialize     # RoLoRA's, from `build_process`
>>> list(rounds), rounds["b_round"].type_signature.parameter[0] == initialize.type_signature.result
(['b_round', 'a_round'], True)
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import schedules
from tffl.engine.personal_state import NO_PERSONAL_STATE, PersonalizedOutput, PersonalSpec

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


def _keyed_aggregator(pieces: Sequence, name: str) -> tff.templates.AggregationProcess:
    """The aggregation of round `name` (weighted or not, as its own), with state
    {round: state} of every round kind."""
    own = next(p for p in pieces if p.name == name)

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(collections.OrderedDict(
            (p.name, p.aggregator.initialize()) for p in pieces))

    def keyed(state, out):
        new = collections.OrderedDict(
            (p.name, out.state if p.name == name else state[p.name]) for p in pieces)
        return tff.templates.MeasuredProcessOutput(tff.federated_zip(new), out.result,
                                                   out.measurements)

    params = own.aggregator.next.type_signature.parameter
    if own.aggregator.is_weighted:
        @tff.federated_computation(initialize.type_signature.result, params[1], params[2])
        def next_fn(state, value, weight):
            return keyed(state, own.aggregator.next(state[name], value, weight))
    else:
        @tff.federated_computation(initialize.type_signature.result, params[1])
        def next_fn(state, value):
            return keyed(state, own.aggregator.next(state[name], value))

    return tff.templates.AggregationProcess(initialize, next_fn)


@tff.tensorflow.computation(np.int32)
def _increment(n):
    return n + 1


def _keyed_finalizer(pieces: Sequence, name: str, weights_type: tff.Type
                     ) -> tff.learning.templates.FinalizerProcess:
    """The server step of round `name`; state {round_num, steps: {round: state}}; with the
    round's `measure`, the measurements are `measure(w, aggregate, round_num)` on the weights w
    the round started from and the new round_num."""
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
        round_num = tff.federated_map(_increment, state.round_num)
        if own.measure is None:
            measurements = tff.federated_value(collections.OrderedDict(), tff.SERVER)
        else:
            measurements = tff.federated_map(own.measure, (weights, update, round_num))
        step_state, new_weights = tff.federated_map(
            own.step.apply, (state.steps[name], weights, update, round_num))
        steps = collections.OrderedDict(
            (p.name, step_state if p.name == name else state.steps[p.name]) for p in pieces)
        new_state = tff.federated_zip(collections.OrderedDict(
            round_num=round_num, steps=tff.federated_zip(steps)))
        return tff.templates.MeasuredProcessOutput(new_state, new_weights, measurements)

    return tff.learning.templates.FinalizerProcess(initialize, next_fn)


def _round_values(names: Sequence[str], state, data, data_type: tff.Type):
    """The round's inputs @CLIENTS (`OrderedDict(name=value)`, broadcast): `round_num`, the
    finalizer's t, and `num_clients`, |I| (a sum of one per client)."""

    @tff.tensorflow.computation(data_type)
    def one(dataset):
        del dataset
        return tf.constant(1.0, tf.float32)

    values = collections.OrderedDict()
    for name in names:
        values[name] = (state.finalizer.round_num if name == "round_num"
                        else tff.federated_sum(tff.federated_map(one, data)))
    return tff.federated_broadcast(tff.federated_zip(values))


def _next_computation(run: Callable, state_type: tff.Type, data_type: tff.Type,
                      personal: PersonalSpec) -> tff.Computation:
    """`run(state, data, personal or None) -> (state, personal', metrics)` as a federated
    computation: TFF's `LearningProcess` `next` without personal state, else the
    stateful-clients one (`PersonalizedOutput`)."""
    data_at_clients = tff.FederatedType(data_type, tff.CLIENTS)
    if not personal:
        @tff.federated_computation(state_type, data_at_clients)
        def next_fn(state, data):
            new_state, _, metrics = run(state, data, None)
            return tff.learning.templates.LearningProcessOutput(new_state, metrics)
        return next_fn

    @tff.federated_computation(state_type, data_at_clients,
                               tff.FederatedType(personal.type, tff.CLIENTS))
    def personalized_next_fn(state, data, personal_states):
        return PersonalizedOutput(*run(state, data, personal_states))

    return personalized_next_fn


def _compose_kind(piece, pieces: Sequence, initialize: tff.Computation, data_type: tff.Type,
                  personal: PersonalSpec) -> tff.Computation:
    """One communication round of kind `piece` (module docstring)."""
    state_type = initialize.type_signature.result
    weights_type = state_type.member.global_model_weights
    distributor = tff.learning.templates.build_broadcast_process(weights_type)
    aggregator = _keyed_aggregator(pieces, piece.name)
    finalizer = _keyed_finalizer(pieces, piece.name, weights_type)
    second = piece.second_exchange

    def run(state, data, personal_states):
        sent = distributor.next(state.distributor, state.global_model_weights)
        inputs = (sent.result, data) + (() if personal_states is None else (personal_states,))
        if piece.round_inputs:
            inputs += (_round_values(piece.round_inputs, state, data, data_type),)
        result, sums, new_personal = tff.federated_map(piece.client_update, inputs)
        if piece.aggregator.is_weighted:
            aggregated = aggregator.next(state.aggregator, result.update, result.update_weight)
        else:
            aggregated = aggregator.next(state.aggregator, result.update)
        if second is not None:
            reply = tff.federated_broadcast(tff.federated_map(second.distributor,
                                                              aggregated.result))
            new_personal = tff.federated_map(second.client_update,
                                             (sent.result, reply, data, new_personal))
        final = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
        new_state = tff.federated_zip(LearningAlgorithmState(
            final.result, sent.state, state.client_work, aggregated.state, final.state))
        metrics = tff.federated_zip(collections.OrderedDict(
            distributor=sent.measurements,
            client_work=_train_metrics(sums, piece.finalize_metrics),
            aggregator=aggregated.measurements, finalizer=final.measurements))
        return new_state, new_personal, metrics

    return _next_computation(run, state_type, data_type, personal)


def _finalize_metrics(sums):
    n = sums["num_examples"]
    return collections.OrderedDict(
        loss=tf.math.divide_no_nan(sums["loss_sum"], n),
        accuracy=tf.math.divide_no_nan(sums["num_correct"], n), num_examples=n)


def _train_metrics(metric_sums, finalize=None):
    """`client_work`: `sum_then_finalize` of the clients' metric sums -> `finalize(Σ_i sums_i)`,
    by default {loss, accuracy, num_examples} of a Keras round."""
    return tff.federated_zip(collections.OrderedDict(
        train=tff.learning.metrics.sum_then_finalize(finalize or _finalize_metrics)(
            metric_sums)))


def compose_kinds(pieces: Sequence, initial_weights: tff.Computation, data_type: tff.Type,
                  personal: PersonalSpec = NO_PERSONAL_STATE
                  ) -> tuple[tff.Computation, collections.OrderedDict]:
    """`(initialize, {round kind: next})`: every kind of `pieces` composed with the keyed states
    (module docstring).

    Args:
      pieces: the round kinds (`tffl.engine.rounds.RoundPieces`).
      initial_weights: `() -> w⁰`, a no-argument TF computation (unplaced).
      data_type: one client's data's type (unplaced).
      personal: the clients' personal state (`NO_PERSONAL_STATE`: none, the rounds are TFF
        `LearningProcess` rounds).

    Raises:
      ValueError: a kind with a second exchange and no personal state (its only output).
    """
    if not personal and any(p.second_exchange is not None for p in pieces):
        raise ValueError("a round kind with a second exchange returns the clients' personal "
                         "states: declare them (a PersonalSpec)")
    weights_type = initial_weights.type_signature.result

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(LearningAlgorithmState(
            tff.federated_eval(initial_weights, tff.SERVER),
            tff.learning.templates.build_broadcast_process(weights_type).initialize(),
            tff.federated_value((), tff.SERVER),
            _keyed_aggregator(pieces, pieces[0].name).initialize(),
            _keyed_finalizer(pieces, pieces[0].name, weights_type).initialize()))

    rounds = collections.OrderedDict(
        (p.name, _compose_kind(p, pieces, initialize, data_type, personal)) for p in pieces)
    return initialize, rounds


# The cycle: several round kinds in one `next`.

def _nested(value, value_type: tff.Type):
    """A struct value inside a TF computation as nested OrderedDicts/lists, read off its type."""
    if not isinstance(value_type, tff.StructType):
        return value
    items = [(name, _nested(value[i], t))
             for i, (name, t) in enumerate(tff.structure.iter_elements(value_type))]
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


def compose_cycle(rounds: Mapping[str, tff.Computation], kinds: Sequence[str],
                  personal: PersonalSpec = NO_PERSONAL_STATE, shared_data: bool = False
                  ) -> tff.Computation:
    """One federated computation running the communication rounds `kinds` in turn, each on its
    own clients' data, each starting from the state (and personal states) the one before left:

        next(state, {<kind_1=D*, ..., kind_E=D*>}@CLIENTS[, personal@CLIENTS])
          = rounds[kind_E](... rounds[kind_1](state, data.kind_1[, personal]) ...)

    with TFF's metric structure (`client_work/train`: loss and accuracy over all rounds'
    examples, or the linear rounds' mean loss; `distributor`, `aggregator`, `finalizer` stacked
    per round; `finalizer/round_kind`: the kinds, in order). With `shared_data`, `next(state,
    D@CLIENTS)` gives every round the same clients and data (an algorithm whose exchanges must
    reach the same clients, as RoLoRA's Alt-min-GD's). The cycle cannot be one MapReduceForm
    (its second broadcast depends on the first aggregate), so bytes stay per communication
    round (`Process.traffic`, read off each round's own computation).

    Raises:
      ValueError: the rounds' metrics differ in structure (they could not be stacked).
    """
    data_type = rounds[kinds[0]].type_signature.parameter[1].member
    names = None if shared_data else schedules.cycle_data_names(kinds)
    cycle_type = data_type if shared_data else tff.StructType(
        [(n, data_type) for n in names])
    metric_types = [rounds[k].type_signature.result.metrics.member for k in kinds]
    if any(not t.is_equivalent_to(metric_types[0]) for t in metric_types[1:]):
        raise ValueError(f"round kinds {list(kinds)} report metrics of different structures; a "
                         "cycle stacks them per round, so they must agree")
    combine = _combine_metrics(kinds, tff.StructType(metric_types))

    def run(state, data, personal_states):
        metrics = []
        for e, kind in enumerate(kinds):
            own = data if names is None else data[names[e]]
            if personal_states is None:
                output = rounds[kind](state, own)
            else:
                output = rounds[kind](state, own, personal_states)
                personal_states = output.personal_states
            state = output.state
            metrics.append(output.metrics)
        return state, personal_states, tff.federated_map(combine, tff.federated_zip(metrics))

    return _next_computation(run, rounds[kinds[0]].type_signature.parameter[0], cycle_type,
                             personal)


# The state's helpers.

def weights_computations(state_type: tff.Type, stored: Callable | None = None
                         ) -> tuple[tff.Computation, tff.Computation]:
    """`(get_model_weights, set_model_weights)` TF computations on the (unplaced) state's
    federated weights (`global_model_weights`), as `compose_learning_process` builds them;
    `set_model_weights` stores `stored(w)` (a TF function, e.g. a QR) when given, else w."""

    @tff.tensorflow.computation(state_type)
    def get_model_weights(state):
        return state.global_model_weights

    @tff.tensorflow.computation(state_type, state_type.global_model_weights)
    def set_model_weights(state, weights):
        return LearningAlgorithmState(weights if stored is None else stored(weights),
                                      state.distributor, state.client_work, state.aggregator,
                                      state.finalizer)

    return get_model_weights, set_model_weights


def initialize_from_clients(initialize: tff.Computation, client_statistic: tff.Computation,
                            weights_from_mean: tff.Computation) -> tff.Computation:
    """`(data@CLIENTS) -> state@SERVER`: `initialize()`'s state with w⁰ =
    `weights_from_mean`((1/N) Σ_i s_i), s_i = `client_statistic`(data_i) (e.g. FedRep's method
    of moments: s_i = (1/m_i) Σ_j y_ij² x_ij x_ijᵀ, w⁰ = its top-k eigenvectors)."""
    state_type = initialize.type_signature.result.member
    _, replace = weights_computations(state_type)

    @tff.federated_computation(tff.FederatedType(client_statistic.type_signature.parameter,
                                                 tff.CLIENTS))
    def initialize_from(data):
        mean = tff.federated_mean(tff.federated_map(client_statistic, data))
        weights = tff.federated_map(weights_from_mean, mean)
        return tff.federated_map(replace, tff.federated_zip((initialize(), weights)))

    return initialize_from
