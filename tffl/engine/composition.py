"""Composition: an algorithm's round kinds (`tffl.engine.rounds.RoundPieces`) as federated
computations sharing one state — for the Keras algorithms and the linear ones alike.

Every kind is composed from TFF's four pieces (`compose_kinds`) — `compose_learning_process` for
stateless clients holding `tf.data` sequences, `compose_round` (its twin, which also takes the
personal state in and out at CLIENTS, or tensor client data) otherwise — with the aggregator and
finalizer states keyed by round kind and a `round_num` counter in the finalizer state:

    LearningAlgorithmState(global_model_weights = w, distributor = (), client_work = (),
                           aggregator = {round: state},
                           finalizer = {round_num, steps: {round: server-step state}})

so all kinds share one state type and one `initialize` (`compose_kinds`; `compose_rounds`
on a Keras `FederatedModel`), and
`build_process` makes them one `tffl.engine.process.Process` run by a schedule.

>>> rounds, initialize = process.rounds, process.initialize     # RoLoRA's, from `build_process`
>>> list(rounds), rounds["b_round"].type_signature.parameter[0] == initialize.type_signature.result
(['b_round', 'a_round'], True)
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import process as process_lib
from tffl.engine import rounds as engine
from tffl.engine.personal_state import PersonalizedOutput

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
        if own.round_measure is not None:
            measurements = tff.federated_map(own.round_measure, round_num)
        step_state, new_weights = tff.federated_map(
            own.step.apply, (state.steps[name], weights, update, round_num))
        steps = collections.OrderedDict(
            (p.name, step_state if p.name == name else state.steps[p.name]) for p in pieces)
        new_state = tff.federated_zip(collections.OrderedDict(
            round_num=round_num, steps=tff.federated_zip(steps)))
        return tff.templates.MeasuredProcessOutput(new_state, new_weights, measurements)

    return tff.learning.templates.FinalizerProcess(initialize, next_fn)


def _client_work(piece: engine.RoundPieces, weights_type, data_type):
    if piece.round_counter:
        return _counting_client_work(piece, weights_type, data_type)

    @tff.federated_computation
    def initialize():
        return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(weights_type, tff.CLIENTS),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def next_fn(state, weights, data):
        result, sums, _ = tff.federated_map(piece.client_update, (weights, data))
        return tff.templates.MeasuredProcessOutput(
            state, result, engine.train_metrics(sums, piece.finalize_metrics))

    return tff.learning.templates.ClientWorkProcess(initialize, next_fn)


def _counting_client_work(piece: engine.RoundPieces, weights_type, data_type):
    """Client work whose state is the round number t (int32), broadcast to every client with
    the weights: `client_update(w, data, t)`; t + 1 after the round."""

    @tff.federated_computation
    def initialize():
        return tff.federated_value(np.int32(0), tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(weights_type, tff.CLIENTS),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def next_fn(state, weights, data):
        t = tff.federated_broadcast(state)
        result, sums, _ = tff.federated_map(piece.client_update, (weights, data, t))
        return tff.templates.MeasuredProcessOutput(
            tff.federated_map(_increment(), state), result,
            engine.train_metrics(sums, piece.finalize_metrics))

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


def _initialize(initial_weights_fn, distributor, aggregator, finalizer) -> tff.Computation:
    """`() -> LearningAlgorithmState@SERVER`, as `compose_learning_process` initializes."""

    @tff.federated_computation
    def initialize():
        return tff.federated_zip(LearningAlgorithmState(
            tff.federated_eval(initial_weights_fn, tff.SERVER), distributor.initialize(),
            tff.federated_value((), tff.SERVER), aggregator.initialize(),
            finalizer.initialize()))

    return initialize


def build_initialize(pieces: Sequence[engine.RoundPieces], initial_weights_fn,
                     weights_type) -> tff.Computation:
    """The `initialize` `compose_kinds` gives `pieces`, built from their aggregators and server
    steps alone (their client work may not exist yet: a linear server's state type is needed to
    write its clients' and server's computations)."""
    return _initialize(initial_weights_fn,
                       tff.learning.templates.build_broadcast_process(weights_type),
                       _keyed_aggregator(pieces, pieces[0].name),
                       _keyed_finalizer(pieces, pieces[0].name, weights_type))


def compose_round(initial_weights_fn, distributor, piece: engine.RoundPieces, aggregator,
                  finalizer, data_type, personal_type=None, count_clients: bool = False):
    """`compose_learning_process`'s round, for what it cannot take: personal state in and out at
    CLIENTS, or client data that are tensors rather than `tf.data` sequences (the linear
    algorithms' batches). The same state type and metric structure:

        personal_type None: next(state, data@C) -> LearningProcessOutput(state, metrics)
        otherwise:          next(state, data@C, personal@C)
                              -> PersonalizedOutput(state, personal@C, metrics)

    `piece.client_update` is `(w, data[, personal][, |I|]) -> (ClientResult, metric sums,
    personal')`. With `count_clients` (a hook's round input `num_clients`), the round first sums
    one per client and broadcasts |I| to every client beside the weights."""
    client_update = piece.client_update

    @tff.tensorflow.computation(data_type)
    def one(dataset):
        del dataset
        return tf.constant(1.0, tf.float32)

    initialize = _initialize(initial_weights_fn, distributor, aggregator, finalizer)

    def run(state, data, personal):
        sent = distributor.next(state.distributor, state.global_model_weights)
        inputs = (sent.result, data) + (() if personal is None else (personal,))
        if count_clients:
            count = tff.federated_broadcast(tff.federated_sum(tff.federated_map(one, data)))
            inputs += (tff.federated_map(_as_round_values, count),)
        result, sums, new_personal = tff.federated_map(client_update, inputs)
        aggregated = aggregator.next(state.aggregator, result.update, result.update_weight)
        final = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
        new_state = tff.federated_zip(LearningAlgorithmState(
            final.result, sent.state, state.client_work, aggregated.state, final.state))
        metrics = tff.federated_zip(collections.OrderedDict(
            distributor=sent.measurements,
            client_work=engine.train_metrics(sums, piece.finalize_metrics),
            aggregator=aggregated.measurements, finalizer=final.measurements))
        return new_state, new_personal, metrics

    state_type, data_at_clients = initialize.type_signature.result, tff.FederatedType(
        data_type, tff.CLIENTS)
    if personal_type is None:
        @tff.federated_computation(state_type, data_at_clients)
        def next_fn(state, data):
            new_state, _, metrics = run(state, data, None)
            return tff.learning.templates.LearningProcessOutput(new_state, metrics)
        return initialize, next_fn

    @tff.federated_computation(state_type, data_at_clients,
                               tff.FederatedType(personal_type, tff.CLIENTS))
    def personalized_next_fn(state, data, personal):
        return PersonalizedOutput(*run(state, data, personal))

    return initialize, personalized_next_fn


def _is_sequences(data_type: tff.Type) -> bool:
    """Whether one client's data is a `tf.data` sequence (or a structure of them), as
    `compose_learning_process` requires."""
    if isinstance(data_type, tff.SequenceType):
        return True
    return (isinstance(data_type, tff.StructType) and len(data_type) > 0
            and all(_is_sequences(t) for t in data_type))


def compose_kinds(pieces: Sequence[engine.RoundPieces], initial_weights_fn, weights_type,
                  data_type, personal_type=None, count_clients: bool = False):
    """`(initialize, {round kind: next})`: every kind composed from TFF's four pieces with the
    keyed states — by `tff.learning.templates.compose_learning_process` when the clients are
    stateless and hold `tf.data` sequences, by its twin `compose_round` otherwise (personal
    state, or tensor client data).

    Args:
      pieces: the round kinds (`tffl.engine.rounds.RoundPieces`).
      initial_weights_fn: `() -> w⁰`, a no-argument TF computation (unplaced).
      weights_type, data_type: w's and one client's data's types (unplaced).
      personal_type: one client's personal state type, or None (stateless clients).
      count_clients: every client also gets |I| (`compose_round`).
    """
    if len(pieces) > 1 and any(p.round_counter for p in pieces):
        raise ValueError("a round kind that counts rounds in its client work (a switch round) "
                         "must be the algorithm's only kind: the kinds share one state type")
    if personal_type is not None and any(p.round_counter for p in pieces):
        raise ValueError("a switch round has no personal state")
    rounds, initialize = collections.OrderedDict(), None
    for piece in pieces:
        distributor = tff.learning.templates.build_broadcast_process(weights_type)
        aggregator = _keyed_aggregator(pieces, piece.name)
        finalizer = _keyed_finalizer(pieces, piece.name, weights_type)
        if personal_type is None and (_is_sequences(data_type) or piece.round_counter):
            composed = tff.learning.templates.compose_learning_process(
                initial_weights_fn, distributor, _client_work(piece, weights_type, data_type),
                aggregator, finalizer)
            init, next_fn = composed.initialize, composed.next
        else:
            init, next_fn = compose_round(initial_weights_fn, distributor, piece, aggregator,
                                          finalizer, data_type, personal_type, count_clients)
        initialize = initialize or init
        rounds[piece.name] = next_fn
    return initialize, rounds


def compose_rounds(model: engine.FederatedModel, pieces: Sequence[engine.RoundPieces],
                   personal: bool, hook=None):
    """`compose_kinds` on a Keras `FederatedModel`: its federated weights, its data, and (if
    `personal`) its personal state and the hook's round inputs."""
    return compose_kinds(
        pieces, _initial_weights_fn(model), model.layout.global_type(), model.data_type(),
        personal_type=engine.personal_type(model, hook) if personal else None,
        count_clients=personal and "num_clients" in engine.round_inputs(hook))


def weights_computations(initialize):
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


def personal_spec(model: engine.FederatedModel, hook=None) -> process_lib.PersonalSpec:
    """One client's personal state on a Keras model: its personal variables (initially the
    model's, the same for every client) and the hook's zero-initialized extra tensors."""
    spec = model.spec
    infos = [spec.trainable[k] for k in model.layout.personal]
    extra = list(hook.extra_types if hook else ())
    initial = [np.asarray(v) for v in model.initial_personal] + [
        np.zeros(t.shape, np.dtype(getattr(t.dtype, "as_numpy_dtype", t.dtype)))
        for t in extra]

    def initialize(client_id):
        del client_id
        return [v.copy() for v in initial]

    return process_lib.PersonalSpec(
        names=tuple(i.name for i in infos) + tuple(f"extra state {k}" for k in range(len(extra))),
        shapes=tuple(v.shape for v in initial), dtypes=tuple(v.dtype for v in initial),
        initial=initialize)


def build_process(algorithm: str, model: engine.FederatedModel,
                  pieces: Sequence[engine.RoundPieces], schedule, *, personalized: bool = False,
                  hook=None, personal: process_lib.PersonalSpec | None = None,
                  **options) -> process_lib.Process:
    """A Keras algorithm's `Process`: its round kinds (`pieces`) composed with one shared state
    (`compose_rounds`), run by `schedule`; `personalized`: the clients keep `personal` (default
    `personal_spec(model, hook)`). `options`: `ProcessSupport`'s other fields (evaluation,
    traffic_rounds, client_traffic, config)."""
    initialize, rounds = compose_rounds(model, pieces, personal=personalized, hook=hook)
    get_weights, set_weights = weights_computations(initialize)
    if personalized and personal is None:
        personal = personal_spec(model, hook)
    return process_lib.Process(
        process_lib.ProcessParts(
            algorithm, initialize, rounds, get_model_weights=get_weights,
            set_model_weights=set_weights, schedule=schedule,
            personal=personal if personalized else None),
        process_lib.ProcessSupport(declared_traffic={p.name: p.traffic for p in pieces},
                                   model=model, hook=hook, **options))
