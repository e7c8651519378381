"""The linear averaging round on the one engine: TFF's four pieces composed by the one composer
(`tffl.engine.process.build_process`), with the Keras processes' state, a replaceable `tff.aggregators`
factory and bytes per client from TFF's forms (checked against numpy and the types' sizes)."""

import collections
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl import runtime
from tffl.engine import linear_basics, linear_engine
from tffl.engine import process as process_lib

_D, _K, _STEP = 6, 2, 0.1


def _clients(seed=0, sizes=(5, 3, 8)):
    rng = np.random.default_rng(seed)
    return [collections.OrderedDict(x=rng.normal(size=(m, _D)).astype(np.float32),
                                    y=rng.normal(size=m).astype(np.float32)) for m in sizes]


def _process(orthonormal: bool, aggregator=None):
    """One gradient step on B with unit heads w = 1_k (the module docstring's round)."""
    server = linear_engine.build_server(
        _D, _K, lambda: linear_basics.gaussian(_D, _K, seed=3), orthonormal=orthonormal,
        aggregator=aggregator)

    @tff.tensorflow.computation(server.representation_type, server.data_type)
    def client_update(b, data):
        x64, y64, m = linear_basics.batch64(data)
        residual = tf.reduce_sum(x64 @ tf.cast(b, tf.float64), axis=1) - y64
        step = tf.linalg.matvec(x64, residual, transpose_a=True)[:, None] / m
        return linear_basics.client_result(tf.cast(b, tf.float64) - _STEP * step,
                                           tf.reduce_sum(residual**2) / (2.0 * m))

    return process_lib.build_process(
        "unit_heads", [server.averaging_round(client_update)], server.federated(),
        support=process_lib.ProcessSupport(config=types.SimpleNamespace(dim=_D, rank=_K)))


def _numpy_client(b, client):
    """B_i and ℓ_i of the round above, in float64 numpy (written from the formula)."""
    x, y = client["x"].astype(np.float64), client["y"].astype(np.float64)
    residual = x @ b @ np.ones(_K) - y
    step = (x.T @ residual)[:, None] / len(y) * np.ones((1, _K))
    return b - _STEP * step, residual @ residual / (2.0 * len(y))


def _numpy_qr(b):
    q, r = np.linalg.qr(b)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


@pytest.mark.parametrize("orthonormal", [False, True])
def test_round_is_the_unweighted_mean_then_p_and_the_state_is_tffs(orthonormal):
    process, clients = _process(orthonormal), _clients()
    with runtime.local_runtime():
        state = process.initialize()
        b0 = linear_engine.get_representation(state).astype(np.float64)
        output = process.next_round(state, clients)
    assert isinstance(output.state, tff.learning.templates.LearningAlgorithmState)
    assert process.round_num(state) == 0 and process.round_num(output.state) == 1
    uploads, losses = zip(*[_numpy_client(b0, c) for c in clients])
    expected = np.mean(uploads, axis=0)          # unweighted, whatever the m_i
    if orthonormal:
        expected = _numpy_qr(expected)
    np.testing.assert_allclose(linear_engine.get_representation(output.state), expected,
                               atol=1e-5)
    train = output.metrics["client_work"]["train"]
    np.testing.assert_allclose(train["loss"], np.mean(losses), rtol=1e-5)
    assert int(train["num_clients"]) == 3


def test_the_aggregator_is_a_replaceable_tff_aggregators_factory():
    process, clients = _process(False, aggregator=tff.aggregators.SumFactory()), _clients(1)
    with runtime.local_runtime():
        state = process.initialize()
        b0 = linear_engine.get_representation(state).astype(np.float64)
        output = process.next_round(state, clients)
    expected = np.sum([_numpy_client(b0, c)[0] for c in clients], axis=0)   # Σ_i B_i
    np.testing.assert_allclose(linear_engine.get_representation(output.state), expected,
                               rtol=1e-5, atol=1e-5)


def test_stateless_bytes_come_from_tffs_forms():
    process = _process(True)
    traffic = process.traffic["round"]
    b_bytes = 4 * _D * _K
    # Down: B. Up: B_i, its float32 weight (1; the unweighted mean ignores it, but TFF's form
    # still carries it) and the metric sums (ℓ_i float32, the count 1 int32).
    assert (traffic.down, traffic.up) == (b_bytes, b_bytes + 4 + 4 + 4)


def test_set_representation_orthonormalizes_only_an_orthonormal_server():
    b = np.arange(_D * _K, dtype=np.float32).reshape(_D, _K) + 1.0
    for orthonormal in (False, True):
        process = _process(orthonormal)
        with runtime.local_runtime():
            state = linear_engine.set_representation(process, process.initialize(), b)
        got = linear_engine.get_representation(state)
        np.testing.assert_allclose(got, _numpy_qr(b.astype(np.float64)) if orthonormal else b,
                                   atol=1e-5)
        assert process.round_num(state) == 0
