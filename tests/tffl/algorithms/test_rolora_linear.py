"""tffl.algorithms.rolora_linear: RoLoRA's Algorithm 2 (Alt-min-GD) against numpy written from rolora.md
§2.1, and the linear theory's recovery of a* (Theorem 4.5) on tasks.synthetic.rolora_linear."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks.synthetic import rolora_linear
from tffl.algorithms import rolora_linear as rolora_linear_lib


def _clients(problem):
    return [dict(x=problem.features[i].astype(np.float32), y=problem.targets[i].astype(np.float32))
            for i in range(len(problem.features))]


def _numpy_iteration(a, clients, eta):
    """One iteration of Algorithm 2, float64: exact b̃_i, unweighted b̄, one GD step on the mean
    gradient at (a, b̄), normalization."""
    xs = [c["x"].astype(np.float64) for c in clients]
    ys = [c["y"].astype(np.float64) for c in clients]
    b_tilde = [y.T @ (x @ a) / np.sum((x @ a) ** 2) for x, y in zip(xs, ys)]
    b_bar = np.mean(b_tilde, axis=0)
    grads = [(2 / len(x)) * (x.T @ x @ a * (b_bar @ b_bar) - x.T @ y @ b_bar)
             for x, y in zip(xs, ys)]
    losses = [np.sum((y - np.outer(x @ a, b_bar)) ** 2) / len(x) for x, y in zip(xs, ys)]
    a_plus = a - eta * np.mean(grads, axis=0)
    return a_plus / np.linalg.norm(a_plus), b_bar, float(np.mean(losses))


def test_three_iterations_equal_numpy_on_heterogeneous_noisy_clients(tff_runtime):
    d, eta = 6, 0.3
    # Unequal m_i: clients of 20 examples with the last two trimmed to 9 and 14.
    problem = rolora_linear(num_clients=3, num_samples=20, dim=d, heterogeneity=0.5,
                            noise_std=0.1, seed=2)
    clients = _clients(problem)
    clients[1] = {k: v[:9] for k, v in clients[1].items()}
    clients[2] = {k: v[:14] for k, v in clients[2].items()}
    process = rolora_linear_lib.build_rolora_alt_min_gd(d, eta, seed=0)
    state = process.initialize()
    a0 = rolora_linear_lib.get_a(state).astype(np.float64)
    assert np.linalg.norm(a0) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_array_equal(rolora_linear_lib.get_b(state), np.zeros(d))
    a, b = a0, np.zeros(d)
    for t in range(3):   # an iteration: the B round, then the A round (one comm. round each)
        start_loss = np.mean([np.sum((c["y"] - np.outer(c["x"] @ a, b)) ** 2) / len(c["x"])
                              for c in clients])
        assert process.round_name(state) == "b_round"
        b_out = process.next_round(state, clients)
        a, b, loss = _numpy_iteration(a, clients, eta)
        np.testing.assert_allclose(rolora_linear_lib.get_b(b_out.state), b, rtol=1e-5, atol=1e-6)
        b_train = b_out.metrics["b_round"]["client_work"]["train"]
        assert float(b_train["loss"]) == pytest.approx(start_loss, rel=1e-5)
        assert process.round_name(b_out.state) == "a_round"
        out = process.next_round(b_out.state, clients)
        state = out.state
        np.testing.assert_allclose(rolora_linear_lib.get_a(state), a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rolora_linear_lib.get_b(state), b, rtol=1e-5, atol=1e-6)
        train = out.metrics["a_round"]["client_work"]["train"]
        assert float(train["loss"]) == pytest.approx(loss, rel=1e-5)
        assert int(train["num_clients"]) == 3 and process.round_num(state) == 2 * (t + 1)


def test_tffs_next_is_one_iteration_on_the_same_clients(tff_runtime):
    """`next` (what TFF's programs call) runs the B and the A round on the same clients' data:
    the state of two `next_round`s, the mean of their losses, n clients, both kinds named."""
    problem = rolora_linear(num_clients=3, num_samples=10, dim=4, heterogeneity=0.5,
                            noise_std=0.1, seed=1)
    clients = _clients(problem)
    process = rolora_linear_lib.build_rolora_alt_min_gd(4, 0.3, seed=2)
    assert process.data_names is None
    data_type = process.rounds["b_round"].type_signature.parameter[1]
    assert process.next.type_signature.parameter[1] == data_type     # D@CLIENTS, not per kind
    state = process.initialize()
    whole = process.next(state, clients)
    b_out = process.next_round(state, clients)
    a_out = process.next_round(b_out.state, clients)
    for got, want in zip(tff.structure.flatten(tff.structure.from_container(whole.state, True)),
                         tff.structure.flatten(tff.structure.from_container(a_out.state, True))):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    losses = [float(o.metrics[k]["client_work"]["train"]["loss"])
              for o, k in ((b_out, "b_round"), (a_out, "a_round"))]
    train = whole.metrics["client_work"]["train"]
    assert float(train["loss"]) == pytest.approx(np.mean(losses), rel=1e-6)
    assert int(train["num_clients"]) == 3
    assert [k.decode() for k in whole.metrics["finalizer"]["round_kind"]] == ["b_round", "a_round"]


def test_is_a_tff_learning_process_whose_model_weights_are_a_and_b(tff_runtime):
    process = rolora_linear_lib.build_rolora_alt_min_gd(4, 0.3, seed=1)
    assert isinstance(process, tff.learning.templates.LearningProcess)
    assert process.personal is None and process.config.learning_rate == 0.3
    state = process.initialize()
    weights = process.get_model_weights(state)
    assert list(weights) == ["a", "b"]
    np.testing.assert_array_equal(weights["a"], rolora_linear_lib.get_a(state))
    # (a, b) -> (a/‖a‖, ‖a‖·b): the same ΔW = a bᵀ with a unit a; round_num kept.
    a, b = np.array([3.0, 0.0, 4.0, 0.0], np.float32), np.array([1.0, 2.0, 0.0, -1.0], np.float32)
    moved = process.set_model_weights(state, collections.OrderedDict(a=a, b=b))
    np.testing.assert_allclose(rolora_linear_lib.get_a(moved), a / 5, rtol=1e-6)
    np.testing.assert_allclose(rolora_linear_lib.get_b(moved), 5 * b, rtol=1e-6)
    np.testing.assert_allclose(np.outer(rolora_linear_lib.get_a(moved),
                                        rolora_linear_lib.get_b(moved)),
                               np.outer(a, b), rtol=1e-6)
    assert process.round_num(moved) == 0
    problem = rolora_linear(num_clients=2, num_samples=6, dim=4, seed=0)
    output = process.next(moved, _clients(problem))     # TFF's own next: the raw computation
    assert set(output.metrics) == {"distributor", "client_work", "aggregator", "finalizer"}


def test_linear_theory_recovers_a_star_at_a_linear_rate(tff_runtime):
    """Theorem 4.5: homogeneous noiseless clients, η ≤ 1/L_max² (‖b*‖ = 1, η = 0.5): sin θ(a, a*)
    contracts every iteration and ‖a bᵀ − a* b*ᵀ‖ follows it to zero."""
    d = 10
    problem = rolora_linear(num_clients=4, num_samples=60, dim=d, seed=0)
    process = rolora_linear_lib.build_rolora_alt_min_gd(d, 0.5, seed=3)
    rng = np.random.default_rng(1)
    state = rolora_linear_lib.with_a(process, process.initialize(), rng.normal(size=d))
    a_star, b_star = problem.a_star, problem.b_stars[0]

    def sin_theta(a):
        return np.linalg.norm(a - (a @ a_star) * a_star) / np.linalg.norm(a)

    angles = [sin_theta(rolora_linear_lib.get_a(state))]
    assert angles[0] > 0.5
    for _ in range(25):   # iterations: `next` runs the B and the A round
        state = process.next(state, _clients(problem)).state
        angles.append(sin_theta(rolora_linear_lib.get_a(state).astype(np.float64)))
    assert all(later < earlier for earlier, later in zip(angles, angles[1:12]))
    assert angles[-1] < 1e-4
    product = np.outer(rolora_linear_lib.get_a(state).astype(np.float64),
                       rolora_linear_lib.get_b(state).astype(np.float64))
    assert np.linalg.norm(product - np.outer(a_star, b_star)) < 1e-3


def test_bad_input_is_one_line():
    process = rolora_linear_lib.build_rolora_alt_min_gd(4, 0.1)
    with pytest.raises(ValueError, match=r"client 0: x \(3, 5\) and y \(3, 5\) must both be"):
        process.next_round(None, [dict(x=np.zeros((3, 5)), y=np.zeros((3, 5)))])
    with pytest.raises(ValueError, match="learning_rate=0.0 must be"):
        rolora_linear_lib.build_rolora_alt_min_gd(4, 0.0)
    with pytest.raises(ValueError, match="at least one client"):
        process.next_round(None, [])
    with pytest.raises(ValueError, match="a must be a non-zero vector of length d=4"):
        rolora_linear_lib.with_a(process, None, np.zeros(4))


def test_set_model_weights_of_the_wrong_shape_is_one_line(tff_runtime):
    """A linear process has no Keras model: `set_model_weights` checks the value against its
    own TFF type and names the entry and both shapes (before TFF's type error)."""
    process = rolora_linear_lib.build_rolora_alt_min_gd(dim=5, learning_rate=0.1)
    state = process.initialize()
    bad = collections.OrderedDict(a=np.ones(4, np.float32), b=np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"model weights/a must have shape \(5,\), got \(4,\)"):
        process.set_model_weights(state, bad)


def test_each_round_takes_tffs_production_forms_and_saves_with_its_shared_cycle(tmp_path,
                                                                                tff_runtime):
    """The B and A rounds are the engine's four pieces, so TFF compiles each to
    MapReduceForm and DistributeAggregateForm (the old two-exchange round took neither), and
    the bytes per client are read off them: down (a, b), up the upload, its weight, ℓ_i and the
    client count. A saved process loads with `next` on shared data, giving the same state."""
    from tffl import production
    from tffl.engine import communication

    d = 6
    process = rolora_linear_lib.build_rolora_alt_min_gd(d, 0.3, seed=0)
    for name, computation in process.rounds.items():
        assert isinstance(production.to_map_reduce_form(computation),
                          tff.backends.mapreduce.MapReduceForm)
        assert isinstance(production.to_distribute_aggregate_form(computation),
                          tff.backends.mapreduce.DistributeAggregateForm)
        assert communication.round_traffic(computation) == communication.RoundTraffic(
            down=2 * d * 4, up=d * 4 + 4 + 4 + 4)
        assert process.traffic[name] == communication.round_traffic(computation)
    saved = production.load_process(production.save_process(process, tmp_path))
    assert saved.shared_cycle_data and saved.data_names is None
    clients = _clients(rolora_linear(num_clients=2, num_samples=8, dim=d, seed=3))
    state = process.initialize()
    want, got = process.next(state, clients).state, saved.next(state, clients).state
    np.testing.assert_allclose(rolora_linear_lib.get_a(got), rolora_linear_lib.get_a(want),
                               rtol=1e-6)
    np.testing.assert_allclose(rolora_linear_lib.get_b(got), rolora_linear_lib.get_b(want),
                               rtol=1e-6)


def test_next_on_shared_data_runs_in_process_under_tf_distribute():
    """`--runtime=distribute`'s context runs the cycle `next` (both rounds on the same clients)
    to numpy's iteration, as the TFF worker does."""
    from tffl.runtime import distribute

    d, eta = 5, 0.3
    problem = rolora_linear(num_clients=3, num_samples=12, dim=d, heterogeneity=0.5, seed=4)
    clients = _clients(problem)
    process = rolora_linear_lib.build_rolora_alt_min_gd(d, eta, seed=1)
    with distribute.distribute_runtime("CPU:0"):
        state = process.initialize()
        a = rolora_linear_lib.get_a(state).astype(np.float64)
        for _ in range(2):
            state = process.next(state, clients).state
            a, b_bar, _ = _numpy_iteration(a, clients, eta)
            np.testing.assert_allclose(rolora_linear_lib.get_a(state), a, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(rolora_linear_lib.get_b(state), b_bar, rtol=1e-5, atol=1e-6)
    assert process.round_num(state) == 4
