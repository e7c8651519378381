"""tffl.algorithms.fedrep_linear: linear FedRep (SRPFL Algorithm 2, no doubling) against independent numpy.

The numpy reference (`_numpy_round`) writes the round out directly from srpfl.md §2.3:
w_i = lstsq(X_i B, y_i), B_i = B − η (1/m_i) X_iᵀ(X_i B w_i − y_i) w_iᵀ, B̄ = (1/n) Σ_i B_i,
B ← Q of np.linalg.qr(B̄). Subspaces are compared through projections BBᵀ (QR signs may differ).
"""

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks.subspace import principal_angle_distance
from tasks.synthetic import fedrep_linear as synthetic_fedrep_linear
from tffl.algorithms import fedrep_linear
from tffl.engine import linear_engine
from tests.tffl.algorithms.linear_data import clients as _data


def _projection(b):
    b = np.asarray(b, np.float64)
    return b @ b.T


def _numpy_round(b, clients, eta):
    """Independent replica of one round: (new orthonormal B, mean_i (1/(2m_i))‖X_iBw_i − y_i‖²)."""
    b = np.asarray(b, np.float64)
    new, losses = [], []
    for item in clients:
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        w = np.linalg.lstsq(x @ b, y, rcond=None)[0]
        r = x @ b @ w - y
        losses.append(r @ r / (2 * len(y)))
        new.append(b - eta * np.outer(x.T @ r, w) / len(y))
    q, _ = np.linalg.qr(np.mean(new, axis=0))
    return q, float(np.mean(losses))


def _numpy_moments(clients, k):
    p = np.mean([(c["x"].astype(np.float64).T * c["y"].astype(np.float64) ** 2)
                 @ c["x"].astype(np.float64) / len(c["y"]) for c in clients], axis=0)
    _, vectors = np.linalg.eigh(p)
    return vectors[:, -k:]


_RNG = np.random.default_rng(0)
_D, _K = 6, 2
# Three clients with different m (5, 8, 3), arbitrary targets (not from the model).
_CLIENTS = _data([_RNG.normal(size=(m, _D)) for m in (5, 8, 3)],
                 [_RNG.normal(size=m) for m in (5, 8, 3)])
_B0 = np.linalg.qr(_RNG.normal(size=(_D, _K)))[0]


def _train(metrics):
    """The round's training metrics (TFF's structure: client_work/train)."""
    return metrics["client_work"]["train"]


def test_one_round_equals_numpy(tff_runtime):
    process = fedrep_linear.build_fedrep_linear(_D, _K, learning_rate=0.3)
    state = linear_engine.set_representation(process, process.initialize(), _B0)
    np.testing.assert_allclose(_projection(linear_engine.get_representation(state)),
                               _projection(_B0), atol=1e-6)
    b = _B0
    for t in range(3):
        output = process.next_round(state, _CLIENTS)
        b, loss = _numpy_round(b, _CLIENTS, 0.3)
        state = output.state
        got = linear_engine.get_representation(state)
        assert got.shape == (_D, _K) and got.dtype == np.float32
        np.testing.assert_allclose(got.T @ got, np.eye(_K), atol=1e-5)
        np.testing.assert_allclose(_projection(got), _projection(b), atol=1e-5)
        np.testing.assert_allclose(_train(output.metrics)["loss"], loss, rtol=1e-5)
        assert _train(output.metrics)["num_clients"] == 3
        assert process.round_num(state) == t + 1


def test_is_a_tff_learning_process_with_b_as_its_model_weights(tff_runtime):
    process = fedrep_linear.build_fedrep_linear(_D, _K, learning_rate=0.3)
    assert isinstance(process, tff.learning.templates.LearningProcess)
    assert process.personal is None
    state = process.set_model_weights(process.initialize(), _B0.astype(np.float32))
    np.testing.assert_allclose(process.get_model_weights(state),
                               linear_engine.get_representation(state))
    output = process.next(state, _CLIENTS)          # TFF's own next: the raw computation
    assert isinstance(output, tff.learning.templates.LearningProcessOutput)
    assert set(output.metrics) == {"distributor", "client_work", "aggregator", "finalizer"}
    assert process.config.learning_rate == 0.3


def test_heads_are_exact_least_squares(tff_runtime):
    process = fedrep_linear.build_fedrep_linear(_D, _K, learning_rate=0.3)
    for item in _CLIENTS:
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        expected = np.linalg.lstsq(x @ _B0, y, rcond=None)[0]
        np.testing.assert_allclose(fedrep_linear.head(process, _B0, item), expected,
                                   rtol=1e-5, atol=1e-6)


def test_initialize_is_seeded_and_orthonormal(tff_runtime):
    b1 = linear_engine.get_representation(
        fedrep_linear.build_fedrep_linear(_D, _K, 0.1, seed=3).initialize())
    b2 = linear_engine.get_representation(
        fedrep_linear.build_fedrep_linear(_D, _K, 0.1, seed=3).initialize())
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_allclose(b1.T @ b1, np.eye(_K), atol=1e-6)


def test_method_of_moments_equals_numpy(tff_runtime):
    problem = synthetic_fedrep_linear(num_clients=20, num_samples=20, dim=20, rank=2, seed=0)
    clients = _data(problem.features, problem.targets)
    process = fedrep_linear.build_fedrep_linear(20, 2, learning_rate=0.5)
    state = fedrep_linear.initialize_by_moments(process, clients)
    b0 = linear_engine.get_representation(state)
    np.testing.assert_allclose(b0.T @ b0, np.eye(2), atol=1e-5)
    np.testing.assert_allclose(_projection(b0), _projection(_numpy_moments(clients, 2)),
                               atol=1e-4)
    assert process.round_num(state) == 0
    assert principal_angle_distance(b0, problem.b_star) < 0.9


@pytest.mark.parametrize("noise_std, floor", [(1e-3, 1e-3), (0.0, 1e-5)])
def test_recovers_b_star_to_the_noise_floor(tff_runtime, noise_std, floor):
    """d=20, k=2, N=20, m=20, η=0.5, fresh samples each round (Algorithm 2), 30 rounds.

    Observed: dist ≈ 1.5e-4 after 30 rounds at σ = 1e-3, ≈ 6e-7 (float32 round-off) at σ = 0.
    """
    problem = synthetic_fedrep_linear(num_clients=20, num_samples=20, dim=20, rank=2,
                                      noise_std=noise_std, seed=0)
    process = fedrep_linear.build_fedrep_linear(20, 2, learning_rate=0.5)
    state = fedrep_linear.initialize_by_moments(process, _data(problem.features, problem.targets))
    distances = [principal_angle_distance(linear_engine.get_representation(state),
                                          problem.b_star)]
    losses = []
    for t in range(30):
        fresh = problem.resample(seed=1000 + t)
        output = process.next_round(state, _data(fresh.features, fresh.targets))
        state = output.state
        losses.append(float(_train(output.metrics)["loss"]))
        distances.append(principal_angle_distance(linear_engine.get_representation(state),
                                                  problem.b_star))
    assert distances[0] < 0.9
    assert distances[-1] < floor, distances
    assert distances[10] < distances[0] / 5
    # The mean loss at the exact heads falls to the noise level σ²/2 (σ = 0: to round-off).
    assert losses[-1] < 10 * noise_std**2 + 1e-9 and losses[0] > 1e-2


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="rank"):
        fedrep_linear.build_fedrep_linear(5, 0, 0.1)
    with pytest.raises(ValueError, match="rank"):
        fedrep_linear.build_fedrep_linear(5, 6, 0.1)
    with pytest.raises(ValueError, match="learning_rate"):
        fedrep_linear.build_fedrep_linear(5, 2, 0.0)
    with pytest.raises(ValueError, match="learning_rate"):
        fedrep_linear.build_fedrep_linear(5, 2, -1.0)
    with pytest.raises(ValueError, match="dim"):
        fedrep_linear.build_fedrep_linear(0, 1, 0.1)


def test_bad_shapes_raise(tff_runtime):
    process = fedrep_linear.build_fedrep_linear(_D, _K, learning_rate=0.3)
    state = process.initialize()
    bad = _data([np.zeros((4, _D + 1))], [np.zeros(4)])
    with pytest.raises(ValueError, match="shape"):
        process.next_round(state, bad)
    with pytest.raises(ValueError, match="shape"):
        process.next_round(state, _data([np.zeros((4, _D))], [np.zeros(3)]))
    with pytest.raises(ValueError, match="at least one client"):
        process.next_round(state, [])
    with pytest.raises(ValueError, match="shape"):
        fedrep_linear.initialize_by_moments(process, bad)
    with pytest.raises(ValueError, match="shape"):
        linear_engine.set_representation(process, state, np.zeros((_D, _K + 1)))
