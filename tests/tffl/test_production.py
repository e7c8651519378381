"""tffl.production: production forms and serialization of the federated LoRA computations.

Each check runs the compiled or deserialized computation on the small problem of
`test_lora_fl` (one LoRA layer, d_in=4, d_out=3, r=2, three clients of 4, 6 and 2 examples, B
started non-zero) and compares it with the process's own computation on the same input.
"""

import collections
import functools
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.lora_linear import A0, BATCH, CLIENTS, D_IN, D_OUT, LR, W0
from tests.tffl.algorithms.lora_linear import (
    client_datasets,
    linear_model_fn,
    linear_spec,
    small_process,
    start,
)
from tests.tffl.algorithms import personalized_models
from tffl.algorithms import lora_fl
from tffl import production
from tffl.engine import personal_state
from tffl.engine.process import Process

STATELESS = ("fedavg_lora", "ffa_lora", "rolora", "rolora_ffa")   # take DistributeAggregateForm
STACKING = ("flexlora", "flora")   # stack uploaded factors with `tff.federated_aggregate`
ALL = (*STATELESS, *STACKING)
MAP_REDUCE_PIECES = ("prepare", "work", "zero", "accumulate", "merge", "report", "update")


@functools.cache
def _process(name):
    if name == "flora":  # FLoRA merges A·B into the kernel it is linked to
        return lora_fl.build_lora_process(
            name, linear_model_fn([(W0, A0)], link=True), linear_spec(D_IN, D_OUT), LR,
            loss_fn=tf.keras.losses.MeanSquaredError)
    if name == "rolora_ffa":   # one switch round kind: B or A chosen in-graph by round number
        return lora_fl.build_rolora_then_ffa(
            0.5, 4, linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), LR,
            loss_fn=tf.keras.losses.MeanSquaredError)
    return small_process(name)


@functools.cache
def _map_reduce_forms(name):
    return production.to_map_reduce_form(_process(name))


@functools.cache
def _distribute_aggregate_forms(name):
    return production.to_distribute_aggregate_form(_process(name))


def _leaves(value):
    return tff.structure.flatten(tff.structure.from_container(value, recursive=True))


def _assert_same(actual, expected):
    """Same leaves in the same order (containers may differ: deserialized computations return
    OrderedDicts and tuples)."""
    actual, expected = _leaves(actual), _leaves(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if np.asarray(e).dtype.kind in "SOU":   # a string metric (a switch round's kind)
            assert a == e
        else:
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def _round_trip(computation):
    data = production.serialize(computation)
    assert isinstance(data, bytes) and data
    restored = production.deserialize(data)
    assert restored.type_signature.is_equivalent_to(computation.type_signature)
    return restored


def _run_map_reduce(pieces, state, datasets):
    """One round driven by hand as a MapReduce backend would: `prepare` on the server, `work` on
    each client, one accumulator per client, merged pairwise, `report`, `update`."""
    broadcast = pieces["prepare"](state)
    accumulators = []
    for dataset in datasets:
        aggregate_input = pieces["work"](dataset, broadcast)[0]
        accumulators.append(pieces["accumulate"](pieces["zero"](), aggregate_input))
    total = functools.reduce(lambda x, y: pieces["merge"](x, y), accumulators)
    return pieces["update"](state, (pieces["report"](total), (), (), ()))


@pytest.mark.parametrize("name", ALL)
def test_each_communication_round_compiles(name):
    """Every round takes MapReduceForm; every round but FlexLoRA's and FLoRA's takes
    DistributeAggregateForm (their stacking `federated_aggregate` gives the documented error); a
    one-round `next` compiles too."""
    process = _process(name)
    rounds = process.rounds
    forms = _map_reduce_forms(name)
    assert list(forms) == list(rounds)
    for round_name, form in forms.items():
        assert isinstance(form, tff.backends.mapreduce.MapReduceForm)
        assert form.type_signature.is_equivalent_to(rounds[round_name].type_signature)
        assert not form.securely_aggregates_tensors
    if name in STACKING:
        with pytest.raises(ValueError, match=rf"{name} \(ab_round\): .*federated_aggregate"):
            production.to_distribute_aggregate_form(process)
        return
    forms = _distribute_aggregate_forms(name)
    assert list(forms) == list(rounds)
    for round_name, form in forms.items():
        assert isinstance(form, tff.backends.mapreduce.DistributeAggregateForm)
        assert form.type_signature.is_equivalent_to(rounds[round_name].type_signature)
    if len(rounds) == 1:
        form = production.to_map_reduce_form(process.next)
        assert isinstance(form, tff.backends.mapreduce.MapReduceForm)
        form = production.to_distribute_aggregate_form(process.next)
        assert isinstance(form, tff.backends.mapreduce.DistributeAggregateForm)


def test_two_chained_rounds_take_neither_form():
    """A computation that runs RoLoRA's B round and then its A round (broadcasting what the B
    round aggregated) is refused with the reason; each round alone compiles (above)."""
    process = _process("rolora")
    b_round, a_round = process.rounds["b_round"], process.rounds["a_round"]

    @tff.federated_computation(b_round.type_signature.parameter[0],
                               b_round.type_signature.parameter[1])
    def two_rounds(state, data):
        middle = b_round(state, data)
        return a_round(middle.state, data)

    for convert in (production.to_map_reduce_form, production.to_distribute_aggregate_form):
        with pytest.raises(ValueError,
                           match="rolora: .*more than one broadcast-aggregate round"):
            convert(two_rounds, name="rolora")


@pytest.mark.parametrize("name", ALL)
def test_serialized_computations_run_the_same(name, tff_runtime):
    """`initialize`, `next` and each communication round, serialized to bytes and back, give the
    original's state and metrics on the same input."""
    process = _process(name)
    initialize = _round_trip(process.initialize)
    _assert_same(initialize(), process.initialize())
    state, datasets = start(process), client_datasets(CLIENTS, BATCH)
    first = process.rounds[process.round_name(state)]
    output = _round_trip(first)(state, datasets)
    assert list(output) == ["state", "metrics"]
    expected = process.next_round(state, datasets)
    _assert_same(output["state"], expected.state)
    metrics = expected.metrics
    if len(process.rounds) > 1:
        metrics = metrics[process.round_name(state)]
    _assert_same(output["metrics"], metrics)
    for computation in process.rounds.values():
        _assert_same(_round_trip(computation)(state, datasets), computation(state, datasets))


@pytest.mark.parametrize("name", ALL)
def test_map_reduce_pieces_compute_the_round(name, tff_runtime):
    """The MapReduceForm's TensorFlow pieces, serialized and back, driven client by client in
    Python (`_run_map_reduce`), give the state and metrics of the round computation: an
    independent check that the compiled form computes what the process does."""
    process = _process(name)
    state, datasets = start(process), client_datasets(CLIENTS, BATCH)
    for round_name, form in _map_reduce_forms(name).items():
        pieces = {piece: _round_trip(getattr(form, piece)) for piece in MAP_REDUCE_PIECES}
        expected = process.rounds[round_name](state, datasets)
        _assert_same(_run_map_reduce(pieces, state, datasets), expected)


@pytest.mark.parametrize("name", STATELESS)
def test_distribute_aggregate_form_recomposes_the_round(name, tff_runtime):
    """The round rebuilt from its DistributeAggregateForm's five pieces, serialized and back,
    gives the process's state and metrics."""
    process = _process(name)
    state, datasets = start(process), client_datasets(CLIENTS, BATCH)
    for round_name, form in _distribute_aggregate_forms(name).items():
        rebuilt = tff.backends.mapreduce.get_computation_for_distribute_aggregate_form(form)
        expected = process.rounds[round_name](state, datasets)
        _assert_same(_round_trip(rebuilt)(state, datasets), expected)


def test_saved_rolora_loads_and_its_rounds_follow_the_schedule(tmp_path, tff_runtime):
    """`save_process`/`load_process`: the loaded `b_round` then `a_round` give the same states and
    metrics as two calls of the process's `next_round`, and the loaded cycle `next` (both rounds
    in one computation) the same state; the manifest records the schedule."""
    process = _process("rolora")
    production.save_process(process, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {
        "initialize.pb", "round_0.pb", "round_1.pb", "next.pb", "get_model_weights.pb",
        "set_model_weights.pb", "manifest.json"}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["cycle"] == ["b_round", "a_round"] and not manifest["personalized"]
    assert manifest["schedule"][:4] == ["b_round", "a_round", "b_round", "a_round"]
    saved = production.load_process(tmp_path)
    assert isinstance(saved, Process) and saved.algorithm == "rolora"
    assert list(saved.rounds) == ["b_round", "a_round"]
    assert saved.cycle == ("b_round", "a_round") and saved.personal is None
    assert [saved.schedule(t) for t in range(4)] == ["b_round", "a_round", "b_round", "a_round"]
    assert saved.next.type_signature.is_equivalent_to(process.next.type_signature)  # B, then A
    _assert_same(saved.initialize(), process.initialize())

    state, datasets = start(process), client_datasets(CLIENTS, BATCH)
    first = process.next_round(state, datasets)
    second = process.next_round(first.state, datasets)
    b_out = saved.rounds["b_round"](state, datasets)
    a_out = saved.rounds["a_round"](b_out.state, datasets)
    _assert_same(b_out.state, first.state)
    _assert_same(a_out.state, second.state)
    _assert_same((b_out.metrics, a_out.metrics),
                 (first.metrics["b_round"], second.metrics["a_round"]))
    cycle = saved.next(state, [collections.OrderedDict(b_round=d, a_round=d) for d in datasets])
    _assert_same(cycle.state, second.state)
    single = production.load_process(production.save_process(_process("ffa_lora"),
                                                             tmp_path / "ffa"))
    assert isinstance(single.next, tff.Computation) and single.round_name(state) == "b_round"
    assert [single.schedule(t) for t in range(2)] == ["b_round", "b_round"]


def test_loaded_process_is_a_learning_process_with_the_same_rounds(tmp_path, tff_runtime):
    """A saved-and-loaded RoLoRA is one `Process` (a TFF `LearningProcess`): `next_round`
    follows the schedule from the state and gives the original's model weights to 1e-6;
    `set_model_weights` round-trips."""
    process = _process("rolora")
    saved = production.load_process(production.save_process(process, tmp_path))
    assert isinstance(saved, tff.learning.templates.LearningProcess)
    original = loaded = start(process)
    datasets = client_datasets(CLIENTS, BATCH)
    for kind in ("b_round", "a_round", "b_round"):
        assert saved.round_name(loaded) == process.round_name(original) == kind
        original = process.next_round(original, datasets).state
        output = saved.next_round(loaded, datasets)
        assert isinstance(output, tff.learning.templates.LearningProcessOutput)
        assert list(output.metrics) == [kind]
        loaded = output.state
    expected, actual = process.get_model_weights(original), saved.get_model_weights(loaded)
    assert isinstance(actual, tff.learning.models.ModelWeights)
    for a, e in zip(_leaves(actual), _leaves(expected)):
        np.testing.assert_allclose(a, e, rtol=0, atol=1e-6)
    _assert_same(saved.get_model_weights(saved.set_model_weights(saved.initialize(), actual)),
                 actual)


def test_loaded_personalized_process_needs_its_initial_personal_state(tmp_path, tff_runtime):
    """A personalized process saves its declared personal state; loading it asks for the
    clients' initial personal states, and the loaded process runs a round as the original."""
    process = personalized_models.built("fedrep")
    production.save_process(process, tmp_path)
    with pytest.raises(ValueError, match="fedrep is personalized: pass initial_personal="):
        production.load_process(tmp_path)
    saved = production.load_process(tmp_path, initial_personal=process.personal.initial)
    assert isinstance(saved, Process)
    assert saved.personal.names == process.personal.names
    assert saved.personal.shapes == tuple(map(tuple, process.personal.shapes))
    assert saved.personal.dtypes == process.personal.dtypes
    state = process.initialize()
    datasets = personalized_models.full_batch_datasets(personalized_models.linear_clients())
    personal = [process.initialize_personal(c) for c in "abc"]
    expected = process.next_round(state, datasets, personal)
    output = saved.next_round(saved.initialize(), datasets,
                              [saved.initialize_personal(c) for c in "abc"])
    assert isinstance(output, personal_state.PersonalizedOutput)
    _assert_same(output, expected)


@pytest.mark.parametrize("algorithm", ["fedrep", "fedper"])
def test_personalized_rounds_take_neither_form(algorithm):
    """Rounds that return the clients' personal state (CLIENTS-placed) are refused with the
    reason; the computations still serialize."""
    process = personalized_models.built(algorithm)
    for convert in (production.to_map_reduce_form, production.to_distribute_aggregate_form):
        with pytest.raises(ValueError, match=rf"{algorithm} \(round\): .*placed at CLIENTS"):
            convert(process)
        with pytest.raises(ValueError, match=rf"{algorithm}: .*placed at CLIENTS"):
            convert(process.rounds["round"], name=algorithm)
    _round_trip(process.rounds["round"])


def test_personalized_fedavg_has_no_personal_state_and_compiles():
    process = personalized_models.built("fedavg")
    assert isinstance(production.to_map_reduce_form(process)["round"],
                      tff.backends.mapreduce.MapReduceForm)
    assert isinstance(production.to_distribute_aggregate_form(process)["round"],
                      tff.backends.mapreduce.DistributeAggregateForm)


def test_not_a_round_and_not_a_computation():
    with pytest.raises(ValueError, match="get_model_weights: MapReduceForm needs one round"):
        production.to_map_reduce_form(_process("ffa_lora").get_model_weights,
                                      name="get_model_weights")
    with pytest.raises(TypeError):
        production.serialize(lambda: 0)
