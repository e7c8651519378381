"""tffl.algorithms.flute_linear: linear FLUTE (Algorithm 1) against an independent numpy replica.

The numpy reference (`_numpy_round`) writes Algorithm 1 out directly with the server holding W
(flute.md §2.2–2.3): R_i = X_i B w_i − y_i,
B ← B − η_l Σ_i (1/N_i) X_iᵀ R_i w_iᵀ + η_r (2γ1 B WWᵀ − 4γ2 B BᵀB),
W ← W − η_l [Bᵀ (1/N_i) X_iᵀ R_i]_i + η_r (2γ1 BᵀB W − 4γ2 WWᵀ W), all at the old (B, W).
The regularizer gradients are checked against central finite differences of R written as the
paper's formula −γ1‖BW‖² + γ2(‖BᵀB‖² + ‖WWᵀ‖²).
"""

import collections

import numpy as np
import pytest

from tasks.synthetic import flute_linear as synthetic_flute_linear
from tffl.algorithms import flute_linear
from tffl.engine import linear_engine
from tffl.engine import personal_state
from tffl.engine.communication import RoundTraffic
from tests.tffl.algorithms.linear_data import clients as _data


def _personal(w):
    """Personal states from W (k×M)."""
    return [collections.OrderedDict(head=np.asarray(col, np.float32)) for col in w.T]


def _regularizer(b, w, g1, g2):
    bw, btb, wwt = b @ w, b.T @ b, w @ w.T
    return -g1 * np.sum(bw**2) + g2 * (np.sum(btb**2) + np.sum(wwt**2))


def _numpy_round(b, w, clients, eta_l, eta_r, g1, g2):
    """Independent replica of Algorithm 1 with the server holding W: (B', W', mean loss, R)."""
    b, w = np.asarray(b, np.float64), np.asarray(w, np.float64)
    grad_b = np.zeros_like(b)
    grad_w = np.zeros_like(w)
    losses = []
    for i, item in enumerate(clients):
        x, y = item["x"].astype(np.float64), item["y"].astype(np.float64)
        r = x @ b @ w[:, i] - y
        losses.append(r @ r / (2 * len(y)))
        grad_b += np.outer(x.T @ r, w[:, i]) / len(y)
        grad_w[:, i] = b.T @ x.T @ r / len(y)
    wwt, btb = w @ w.T, b.T @ b
    new_b = b - eta_l * grad_b + eta_r * (2 * g1 * b @ wwt - 4 * g2 * b @ btb)
    new_w = w - eta_l * grad_w + eta_r * (2 * g1 * btb @ w - 4 * g2 * wwt @ w)
    return new_b, new_w, float(np.mean(losses)), _regularizer(b, w, g1, g2)


_RNG = np.random.default_rng(0)
_D, _K = 5, 2
# Three clients with different N (4, 7, 3), arbitrary targets; B and W of order 1 so that every
# term of the step matters (not the tiny paper initialization, where R's gradients are ~α³).
_CLIENTS = _data([_RNG.normal(size=(m, _D)) for m in (4, 7, 3)],
                 [_RNG.normal(size=m) for m in (4, 7, 3)])
_B0 = _RNG.normal(size=(_D, _K))
_W0 = _RNG.normal(size=(_K, 3))


def _start(process, b=_B0):
    return linear_engine.set_representation(process, process.initialize(), b)


def _train(metrics):
    """The round's training metrics (TFF's structure: client_work/train)."""
    return metrics["client_work"]["train"]


@pytest.mark.parametrize("g1, g2, eta_r", [(0.25, 0.125, None), (0.1, 0.3, 0.02), (0.0, 0.0, None)])
def test_two_rounds_equal_numpy(tff_runtime, g1, g2, eta_r):
    eta_l = 0.05
    process = flute_linear.build_flute_linear(_D, _K, learning_rate=eta_l,
                                              regularizer_learning_rate=eta_r, gamma1=g1,
                                              gamma2=g2)
    eta_r = eta_l if eta_r is None else eta_r
    state, personal = _start(process), _personal(_W0)
    b, w = _B0, _W0
    for t in range(2):
        output = process.next_round(state, _CLIENTS, personal)
        assert isinstance(output, personal_state.PersonalizedOutput)
        b, w, loss, reg = _numpy_round(b, w, _CLIENTS, eta_l, eta_r, g1, g2)
        state, personal = output.state, output.personal_states
        assert len(personal) == 3 and process.round_num(state) == t + 1
        np.testing.assert_allclose(linear_engine.get_representation(state), b, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(flute_linear.heads(personal), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_train(output.metrics)["loss"], loss, rtol=1e-5)
        np.testing.assert_allclose(output.metrics["finalizer"]["regularizer"], reg, rtol=1e-5,
                                   atol=1e-6)
        assert _train(output.metrics)["num_clients"] == 3
    np.testing.assert_allclose(flute_linear.predictors(state, personal), (b @ w).T, rtol=1e-5,
                               atol=1e-6)


def _finite_difference(f, x, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        grad[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


@pytest.mark.parametrize("g1, g2", [(0.25, 0.125), (0.3, 0.05), (0.0, 0.2)])
def test_regularizer_step_matches_finite_differences(tff_runtime, g1, g2):
    """With x = 0 the data gradients vanish, so one round is B − η_r ∇_B R, W − η_r ∇_W R."""
    eta_r = 0.01
    process = flute_linear.build_flute_linear(_D, _K, learning_rate=0.3,
                                              regularizer_learning_rate=eta_r, gamma1=g1,
                                              gamma2=g2)
    zero = _data([np.zeros((2, _D))] * 3, [np.zeros(2)] * 3)
    output = process.next_round(_start(process), zero, _personal(_W0))
    step_b = (_B0 - linear_engine.get_representation(output.state)) / eta_r
    step_w = (_W0 - flute_linear.heads(output.personal_states)) / eta_r
    fd_b = _finite_difference(lambda b: _regularizer(b, _W0, g1, g2), _B0)
    fd_w = _finite_difference(lambda w: _regularizer(_B0, w, g1, g2), _W0)
    np.testing.assert_allclose(step_b, fd_b, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(step_w, fd_w, rtol=2e-3, atol=2e-3)
    assert _train(output.metrics)["loss"] == 0
    # The pure-TF helper the server uses, in float64 (no float32 boundary): tight agreement.
    import tensorflow as tf
    got = flute_linear.regularizer_gradients(tf.constant(_B0), tf.constant(_W0 @ _W0.T), g1, g2)
    np.testing.assert_allclose(got.numpy(), fd_b, rtol=1e-6, atol=1e-7)


def test_balanced_regularizer_identity(tff_runtime):
    """γ1 = 2γ2: R = γ2‖BᵀB − WWᵀ‖²_F, and the step is −η_r·4γ2 B(BᵀB − WWᵀ), +η_r·4γ2(BᵀB −
    WWᵀ)W (flute.md §2.1, §2.3)."""
    g2 = 0.125
    expected = g2 * np.sum((_B0.T @ _B0 - _W0 @ _W0.T) ** 2)
    assert _regularizer(_B0, _W0, 2 * g2, g2) == pytest.approx(expected, rel=1e-12)
    eta_r = 0.01
    process = flute_linear.build_flute_linear(_D, _K, learning_rate=0.1,
                                              regularizer_learning_rate=eta_r, gamma1=2 * g2,
                                              gamma2=g2)
    zero = _data([np.zeros((2, _D))] * 3, [np.zeros(2)] * 3)
    output = process.next_round(_start(process), zero, _personal(_W0))
    np.testing.assert_allclose(output.metrics["finalizer"]["regularizer"], expected, rtol=1e-5)
    diff = _B0.T @ _B0 - _W0 @ _W0.T
    np.testing.assert_allclose(linear_engine.get_representation(output.state),
                               _B0 - eta_r * 4 * g2 * _B0 @ diff, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flute_linear.heads(output.personal_states),
                               _W0 + eta_r * 4 * g2 * diff @ _W0, rtol=1e-5, atol=1e-6)


def test_initialization_is_small_seeded_and_per_client(tff_runtime):
    process = flute_linear.build_flute_linear(10, 3, learning_rate=0.03, seed=4)
    assert process.config.init_scale == pytest.approx(0.01)  # 1/(10d)
    b = linear_engine.get_representation(process.initialize())
    assert b.shape == (10, 3) and b.dtype == np.float32
    assert 0.003 < b.std() < 0.03 and np.all(b != 0)
    np.testing.assert_array_equal(
        b, linear_engine.get_representation(
            flute_linear.build_flute_linear(10, 3, 0.03, seed=4).initialize()))
    h1, h2 = process.initialize_personal("client_01"), process.initialize_personal("client_02")
    assert h1["head"].shape == (3,) and h1["head"].dtype == np.float32
    np.testing.assert_array_equal(h1["head"], process.initialize_personal("client_01")["head"])
    assert not np.array_equal(h1["head"], h2["head"])
    assert np.all(np.abs(h1["head"]) < 0.1)
    assert process.personal is not None and process.personal.names == ("head",)
    # Bytes per client, declared (TFF's forms cannot hold personal state at CLIENTS): down B and
    # G = WWᵀ, up ∇_B L_i, w_i w_iᵀ, L_i and the client count (float32 / int32).
    assert process.traffic["round"] == RoundTraffic(down=4 * (30 + 9), up=4 * (30 + 9 + 2))


def test_personal_store_round_trip_keeps_non_participants(tff_runtime):
    """Partial participation through the template's store: only the round's clients change."""
    process = flute_linear.build_flute_linear(_D, _K, learning_rate=0.05)
    store = personal_state.PersonalStore(process.initialize_personal)
    ids = ["a", "b", "c"]
    state = _start(process)
    output = process.next_round(state, _CLIENTS, store.lookup(ids))
    store.update(ids, output.personal_states)
    before = {cid: store.get(cid)["head"].copy() for cid in ids}
    output = process.next_round(output.state, _CLIENTS[:2], store.lookup(ids[:2]))
    store.update(ids[:2], output.personal_states)
    assert _train(output.metrics)["num_clients"] == 2
    np.testing.assert_array_equal(store.get("c")["head"], before["c"])
    assert not np.array_equal(store.get("a")["head"], before["a"])


@pytest.mark.large
def test_fits_the_rank_k_truncation_on_the_papers_synthetic_task(tff_runtime):
    """d=10, k=2, M=30, N=200 (more samples than the paper's 20, so the ERM is close to the
    population optimum), η=0.03, small random init: after 60 rounds the error (1/M)Σ‖Bw_i − φ_i‖
    is within 5% of the Eckart–Young floor (1/M)Σ‖B*w_i* − φ_i‖. Observed: 1.59 against 1.58."""
    problem = synthetic_flute_linear(num_clients=30, num_samples=200, dim=10, seed=0)
    floor = np.mean(np.linalg.norm(problem.optimal_predictors(2) - problem.phi, axis=0))
    process = flute_linear.build_flute_linear(10, 2, learning_rate=0.03)
    ids = [f"client_{i:03d}" for i in range(30)]
    state, personal = process.initialize(), [process.initialize_personal(c) for c in ids]
    data = _data(problem.features, problem.targets)
    errors = []
    for _ in range(60):
        output = process.next_round(state, data, personal)
        state, personal = output.state, output.personal_states
        errors.append(np.mean(np.linalg.norm(flute_linear.predictors(state, personal)
                                             - problem.phi.T, axis=1)))
    assert errors[0] > 1.5 * floor      # ≈ mean ‖φ_i‖: B⁰w_i⁰ ≈ 0
    assert errors[-1] < 1.05 * floor, (errors[-1], floor)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dim=0, rank=1), "dim=0"),
        (dict(rank=0), "rank=0"),
        (dict(rank=6), "rank=6"),
        (dict(learning_rate=0.0), "learning_rate=0.0"),
        (dict(learning_rate=-0.1), "learning_rate=-0.1"),
        (dict(learning_rate=float("nan")), "learning_rate=nan"),
        (dict(regularizer_learning_rate=-0.01), "regularizer_learning_rate=-0.01"),
        (dict(gamma1=-0.25), "gamma1=-0.25"),
        (dict(gamma2=-1.0), "gamma2=-1.0"),
        (dict(gamma2=float("inf")), "gamma2=inf"),
        (dict(init_scale=0.0), "init_scale=0.0"),
        (dict(init_scale=-0.01), "init_scale=-0.01"),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs, message):
    args = dict(dim=5, rank=2, learning_rate=0.03) | kwargs
    with pytest.raises(ValueError, match=message):
        flute_linear.build_flute_linear(**args)


def test_bad_shapes_raise(tff_runtime):
    process = flute_linear.build_flute_linear(_D, _K, learning_rate=0.03)
    state = process.initialize()
    personal = _personal(_W0)
    with pytest.raises(ValueError, match="shape"):
        process.next_round(state, _data([np.zeros((4, _D + 1))] * 3, [np.zeros(4)] * 3),
                           personal)
    with pytest.raises(ValueError, match="shape"):
        process.next_round(state, _data([np.zeros((4, _D))] * 3, [np.zeros(3)] * 3), personal)
    with pytest.raises(ValueError, match="personal states"):
        process.next_round(state, _CLIENTS, personal[:2])
    with pytest.raises(ValueError, match="head"):
        process.next_round(state, _CLIENTS,
                           [collections.OrderedDict(head=np.zeros(_K + 1))] * 3)
    with pytest.raises(ValueError, match="shape"):
        linear_engine.set_representation(process, state, np.zeros((_D, _K + 1)))
