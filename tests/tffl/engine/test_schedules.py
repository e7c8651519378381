"""tffl.engine.schedules and tffl.engine.composition.compose_cycle: periodic schedules and the
cycle that is a Process's `next`.

RoLoRA's `next` (one `tff.Computation`: its B round, then its A round, each on its own client
data) must equal two communication rounds run one at a time (`next_round`), and its metrics must
be the two rounds' (train loss and accuracy weighted by their examples, which add up)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models.paper_models import RoloraMnistNetConfig, build_rolora_mnist_net
from tffl.algorithms import lora_fl
from tffl.engine import composition, schedules

_D, _CLASSES = 8, 3
_SPEC = (tf.TensorSpec([None, _D], tf.float32), tf.TensorSpec([None], tf.int32))
_STATELESS = ("fedavg_lora", "ffa_lora", "rolora", "flexlora", "flora")


def _model_fn():
    # base_kernel: a frozen W0 linked to the adapter, which FLoRA merges into.
    return build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=_D, rank=2, num_classes=_CLASSES, b_stddev=0.1, trainable_head=True,
        base_kernel=True))


def _datasets(seed, sizes):
    rng = np.random.default_rng(seed)
    return [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(n, _D)).astype(np.float32),
         rng.integers(0, _CLASSES, size=n).astype(np.int32))).batch(3) for n in sizes]


def test_schedules_and_their_cycles():
    rolora = schedules.alternating("b_round", "a_round")
    assert [rolora(t) for t in range(5)] == ["b_round", "a_round"] * 2 + ["b_round"]
    assert schedules.cycle_of(rolora) == ("b_round", "a_round")
    switched = schedules.alternating("b_round", "a_round", switch=3, after="b_round")
    assert [switched(t) for t in range(6)] == ["b_round", "a_round", "b_round"] + ["b_round"] * 3
    assert schedules.cycle_of(switched) is None  # not periodic: no cycle
    assert schedules.cycle_of(schedules.constant("ab_round")) == ("ab_round",)
    assert schedules.cycle_of(lambda t: "x") is None
    assert schedules.cycle_data_names(("b_round", "a_round")) == ["b_round", "a_round"]
    assert schedules.cycle_data_names(("b_round", "b_round")) == ["round_0", "round_1"]


def test_next_of_every_stateless_algorithm_is_a_typed_computation():
    """TFF's contract: `next` is a `tff.Computation` (state@SERVER, data@CLIENTS) ->
    (state@SERVER, metrics@SERVER) with TFF's metric structure; RoLoRA's data is a pair of
    datasets per client, one per communication round of its cycle."""
    sequence = tff.SequenceType(tff.types.tensorflow_to_type(_SPEC))
    for name in _STATELESS:
        process = lora_fl.build_lora_process(name, _model_fn, _SPEC, 0.1)
        assert isinstance(process, tff.learning.templates.LearningProcess)
        assert isinstance(process.next, tff.Computation), name
        state_type, data_type = process.next.type_signature.parameter
        assert state_type == process.initialize.type_signature.result
        expected_member = sequence
        if name == "rolora":
            assert process.data_names == ("b_round", "a_round")
            expected_member = tff.StructType([("b_round", sequence), ("a_round", sequence)])
        else:
            assert process.data_names is None
        assert data_type == tff.FederatedType(expected_member, tff.CLIENTS), name
        result = process.next.type_signature.result
        assert result.state == state_type
        assert result.metrics.placement is tff.SERVER
        metrics = result.metrics.member
        assert [n for n, _ in tff.structure.iter_elements(metrics)] == [
            "distributor", "client_work", "aggregator", "finalizer"], name
        train = metrics.client_work.train
        assert [n for n, _ in tff.structure.iter_elements(train)] == [
            "loss", "accuracy", "num_examples"]


def _flat(weights):
    return [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]


def test_rolora_next_is_a_b_round_then_an_a_round(tff_runtime):
    process = lora_fl.build_rolora(_model_fn, _SPEC, 0.1)
    b_data, a_data = _datasets(1, (4, 5)), _datasets(2, (6, 3))
    state = process.initialize()

    one_by_one = process.next_round(state, b_data)
    b_metrics = one_by_one.metrics["b_round"]["client_work"]["train"]
    one_by_one = process.next_round(one_by_one.state, a_data)
    a_metrics = one_by_one.metrics["a_round"]["client_work"]["train"]

    pairs = [collections.OrderedDict(b_round=b, a_round=a) for b, a in zip(b_data, a_data)]
    cycle = process.next(state, pairs)
    assert process.round_num(cycle.state) == 2 == process.round_num(one_by_one.state)
    for got, want in zip(_flat(process.get_model_weights(cycle.state)),
                         _flat(process.get_model_weights(one_by_one.state)), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # The B round changed B (and the head), the A round A: neither is the initial value.
    initial = _flat(process.get_model_weights(state))
    assert all(not np.allclose(a, b) for a, b in zip(
        _flat(process.get_model_weights(cycle.state)), initial) if a.size)

    train = cycle.metrics["client_work"]["train"]
    n_b, n_a = float(b_metrics["num_examples"]), float(a_metrics["num_examples"])
    assert (n_b, n_a) == (9.0, 9.0)
    assert float(train["num_examples"]) == n_b + n_a
    for key in ("loss", "accuracy"):
        expected = (float(b_metrics[key]) * n_b + float(a_metrics[key]) * n_a) / (n_b + n_a)
        assert float(train[key]) == pytest.approx(expected, rel=1e-6)
    assert [bytes(k).decode() for k in cycle.metrics["finalizer"]["round_kind"]] == [
        "b_round", "a_round"]


def _round_reporting(metrics):
    """A stand-in round kind: state and data in, the state and `metrics` out."""

    @tff.federated_computation(tff.FederatedType(np.int32, tff.SERVER),
                               tff.FederatedType(np.float32, tff.CLIENTS))
    def round_kind(state, data):
        del data
        return tff.learning.templates.LearningProcessOutput(
            state, tff.federated_value(metrics, tff.SERVER))

    return round_kind


def test_a_cycle_of_rounds_with_different_metrics_is_an_error():
    one = _round_reporting(collections.OrderedDict(a=1.0))
    other = _round_reporting(collections.OrderedDict(b=1))
    with pytest.raises(ValueError, match=r"round kinds \['one', 'other'\] report metrics"):
        composition.compose_cycle({"one": one, "other": other}, ("one", "other"))


def test_personalized_next_is_the_cycle_with_personal_state_threaded(tff_runtime):
    """FedRep heads over RoLoRA-alternated adapters: `next` is one `tff.Computation`, the B
    round then the A round, each on its own data, each client's head passed from the first round
    to the second; it equals two `next_round` calls (to 1e-6), heads included."""
    from tffl.algorithms import personalized

    process = personalized.build_personalized_process("fedrep", _model_fn, _SPEC, 0.1,
                                                      lora_schedule="alternating")
    assert isinstance(process.next, tff.Computation)
    assert process.data_names == ("b_round", "a_round")
    b_data, a_data = _datasets(3, (4, 5)), _datasets(4, (6, 3))
    state = process.initialize()
    personal = [process.initialize_personal(c) for c in ("c0", "c1")]

    first = process.next_round(state, b_data, personal)
    second = process.next_round(first.state, a_data, first.personal_states)
    pairs = [collections.OrderedDict(b_round=b, a_round=a) for b, a in zip(b_data, a_data)]
    cycle = process.next(state, pairs, personal)
    assert process.round_num(cycle.state) == 2
    for got, want in zip(_flat(process.get_model_weights(cycle.state)),
                         _flat(process.get_model_weights(second.state)), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    for got, want in zip(cycle.personal_states, second.personal_states, strict=True):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    assert not np.allclose(cycle.personal_states[0][0], personal[0][0])   # heads trained
    n = [float(o.metrics[k]["client_work"]["train"]["num_examples"])
         for o, k in ((first, "b_round"), (second, "a_round"))]
    assert float(cycle.metrics["client_work"]["train"]["num_examples"]) == sum(n) == 18.0
    assert [bytes(k).decode() for k in cycle.metrics["finalizer"]["round_kind"]] == [
        "b_round", "a_round"]
