"""tffl.engine.composition: the one composer. A round kind with a second exchange (a sum
aggregation, personal state at CLIENTS, the kind's second distributor) against numpy, and the
composer's build-time check."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import composition, linear_basics, linear_engine, rounds
from tffl.engine import process as process_lib
from tffl.engine.personal_state import PersonalizedOutput

_VECTOR = tff.TensorType(np.float32, [2])
_PERSONAL = linear_basics.personal_spec(collections.OrderedDict(p=(2,)),
                                        lambda client_id: collections.OrderedDict(
                                            p=np.zeros(2, np.float32)))


@tff.tensorflow.computation
def _initial_v():
    return tf.constant([1.0, 1.0], tf.float32)


@tff.tensorflow.computation(_VECTOR, _VECTOR, _PERSONAL.type)
def _first(v, x, personal):
    """Uploads x_i + p_i; ℓ_i = ‖x_i − v‖²; keeps p_i."""
    return linear_basics.client_result(x + personal["p"], tf.reduce_sum((x - v) ** 2), personal)


@tff.tensorflow.computation(_VECTOR)
def _first_entry(total):
    return total[0]


@tff.tensorflow.computation(_VECTOR, tff.TensorType(np.float32), _VECTOR, _PERSONAL.type)
def _second(v, total, x, personal):
    """Keeps p_i' = p_i + r·x_i (r = the relayed first entry of the sum)."""
    return collections.OrderedDict(p=personal["p"] + total * x)


@tff.tensorflow.computation(_VECTOR, _VECTOR, np.int32)
def _norm(v, total, round_num):
    return collections.OrderedDict(norm=tf.norm(total))


def _pieces():
    return rounds.RoundPieces(
        "round", _first, aggregator=tff.aggregators.SumFactory().create(_VECTOR),
        step=linear_engine.WeightsStep(_VECTOR, _VECTOR, lambda v, total: total),
        measure=_norm, second_exchange=rounds.SecondExchange(_first_entry, _second),
        finalize_metrics=linear_basics.linear_train_metrics)


def test_sum_round_with_a_second_exchange_equals_numpy(tff_runtime):
    process = process_lib.build_process(
        "two_exchanges", [_pieces()], process_lib.Federated(_initial_v, _VECTOR, _PERSONAL))
    xs = [np.array([1.0, 2.0], np.float32), np.array([-3.0, 0.5], np.float32)]
    ps = [collections.OrderedDict(p=np.array([0.5, 0.0], np.float32)),
          collections.OrderedDict(p=np.array([0.0, -1.0], np.float32))]
    v = np.array([1.0, 1.0], np.float32)
    start = process.initialize()
    start = start._replace(finalizer=collections.OrderedDict(
        round_num=np.int32(3), steps=start.finalizer["steps"]))
    output = process.next_round(start, xs, ps)
    assert isinstance(output, PersonalizedOutput)
    state, personal, metrics = output
    total = sum(x + p["p"] for x, p in zip(xs, ps))                       # Σ_i (x_i + p_i)
    np.testing.assert_allclose(process.get_model_weights(state), total, rtol=1e-6)
    assert process.round_num(state) == 4
    for got, x, p in zip(personal, xs, ps):
        np.testing.assert_allclose(got["p"], p["p"] + total[0] * x, rtol=1e-6)
    # TFF's learning-process structure: the clients' loss and count under client_work/train,
    # the server step's values under finalizer.
    assert list(metrics) == ["distributor", "client_work", "aggregator", "finalizer"]
    train = metrics["client_work"]["train"]
    assert list(train) == ["loss", "num_clients"] and list(metrics["finalizer"]) == ["norm"]
    np.testing.assert_allclose(train["loss"], np.mean([np.sum((x - v) ** 2) for x in xs]),
                               rtol=1e-6)
    np.testing.assert_allclose(metrics["finalizer"]["norm"], np.linalg.norm(total), rtol=1e-6)
    assert int(train["num_clients"]) == 2
    # Bytes per client (declared: TFF's forms cannot hold the round): down v and the relayed
    # first entry, up x_i + p_i, ℓ_i and the client count.
    traffic = process.traffic["round"]
    assert (traffic.down, traffic.up) == (4 * (2 + 1), 4 * (2 + 1 + 1))


def test_a_second_exchange_needs_personal_state():
    with pytest.raises(ValueError, match="second exchange returns the clients' personal"):
        composition.compose_kinds([_pieces()], _initial_v, _VECTOR)
