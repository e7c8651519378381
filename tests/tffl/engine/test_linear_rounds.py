"""tffl.engine.linear_rounds: the declared two-exchange round (sum aggregation with personal state at
CLIENTS, against numpy) and its build-time checks of the client computations' results."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import linear_engine
from tffl.engine import linear_rounds
from tffl.engine.personal_state import PersonalizedOutput

_VECTOR = tff.TensorType(np.float32, [2])
_STATE = tff.StructWithPythonType([("v", _VECTOR), ("round_num", tff.TensorType(np.int32))],
                                  collections.OrderedDict)
_PERSONAL = linear_engine.personal_type(collections.OrderedDict(p=(2,)))


@tff.tensorflow.computation(_STATE)
def _broadcast(state):
    return state["v"]


@tff.tensorflow.computation(_VECTOR, _VECTOR, _PERSONAL)
def _first(v, x, personal):
    """Uploads x_i + p_i; ℓ_i = ‖x_i − v‖²."""
    return collections.OrderedDict(value=x + personal["p"], loss=tf.reduce_sum((x - v) ** 2))


@tff.tensorflow.computation(_VECTOR, tff.TensorType(np.float32), _VECTOR, _PERSONAL)
def _second(v, total, x, personal):
    """Keeps p_i' = p_i + r·x_i (r = the relayed first entry of the sum)."""
    return collections.OrderedDict(personal=collections.OrderedDict(p=personal["p"] + total * x))


@tff.tensorflow.computation(_VECTOR)
def _first_entry(total):
    return total[0]


@tff.tensorflow.computation(_STATE, _VECTOR)
def _server_update(state, total):
    return collections.OrderedDict(v=total, round_num=state["round_num"] + 1)


@tff.tensorflow.computation(_STATE, _VECTOR)
def _server_metrics(state, total):
    return collections.OrderedDict(norm=tf.norm(total))


def test_sum_round_with_personal_state_equals_numpy(tff_runtime):
    pieces = linear_rounds.TwoExchangePieces(
        _broadcast, _first, _second, _server_update, second_broadcast=_first_entry,
        server_metrics=_server_metrics)
    next_fn = linear_rounds.build_two_exchange_round(
        _STATE, _VECTOR, pieces, personal_type=_PERSONAL, aggregation="sum")
    xs = [np.array([1.0, 2.0], np.float32), np.array([-3.0, 0.5], np.float32)]
    ps = [collections.OrderedDict(p=np.array([0.5, 0.0], np.float32)),
          collections.OrderedDict(p=np.array([0.0, -1.0], np.float32))]
    v = np.array([1.0, 1.0], np.float32)
    output = next_fn(collections.OrderedDict(v=v, round_num=np.int32(3)), xs, ps)
    assert isinstance(output, PersonalizedOutput)
    state, personal, metrics = output
    total = sum(x + p["p"] for x, p in zip(xs, ps))                       # Σ_i (x_i + p_i)
    np.testing.assert_allclose(state["v"], total, rtol=1e-6)
    assert int(state["round_num"]) == 4
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
    traffic = linear_rounds.two_exchange_traffic(pieces)
    assert (traffic.down, traffic.up) == (4 * (2 + 1), 4 * (2 + 1 + 1))


@tff.tensorflow.computation(_VECTOR, _VECTOR)
def _plain(v, x):
    return x


@tff.tensorflow.computation(_VECTOR, _VECTOR, _VECTOR)
def _with_loss(v, total, x):
    return collections.OrderedDict(value=x, loss=tf.reduce_sum(x))


@tff.tensorflow.computation(_VECTOR, _VECTOR)
def _first_with_loss(v, x):
    return collections.OrderedDict(value=x, loss=tf.reduce_sum(x))


@tff.tensorflow.computation(_VECTOR, _VECTOR, _VECTOR)
def _mixed(v, total, x):
    return collections.OrderedDict(value=x, loss=tf.reduce_sum(x), extra=x)


@tff.tensorflow.computation(_STATE, _VECTOR, _VECTOR)
def _update_two(state, u, g):
    return collections.OrderedDict(v=u + g, round_num=state["round_num"] + 1)


@pytest.mark.parametrize("first, second, kwargs, message", [
    (_plain, _with_loss, dict(aggregation="median"), "aggregation='median'"),
    (_first_with_loss, _with_loss, {}, "exactly one of"),
    (_plain, _mixed, {}, "extra"),
    (_plain, _with_loss, dict(personal_type=_PERSONAL), "personal"),
])
def test_build_time_checks(first, second, kwargs, message):
    with pytest.raises(ValueError, match=message):
        linear_rounds.build_two_exchange_round(
            _STATE, _VECTOR,
            linear_rounds.TwoExchangePieces(_broadcast, first, second, _update_two), **kwargs)


def test_engine_re_exports_the_rounds():
    assert linear_engine.build_two_exchange_round is linear_rounds.build_two_exchange_round
    assert linear_engine.round_metrics is linear_rounds.round_metrics
    assert linear_engine.count_clients is linear_rounds.count_clients
    assert linear_engine.two_exchange_traffic is linear_rounds.two_exchange_traffic
