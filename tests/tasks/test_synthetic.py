"""Tests for tasks.synthetic: ground-truth properties and targets from independent computations."""

import sys

import numpy as np
import pytest

from tasks import subspace, synthetic


def test_rolora_homogeneous_closed_form_b_solve():
    p = synthetic.rolora_linear(num_clients=4, num_samples=30, dim=6, b_norm=2.0, seed=0)
    assert p.features.shape == (4, 30, 6) and p.targets.shape == (4, 30, 6)
    assert np.linalg.norm(p.a_star) == pytest.approx(1.0)
    assert np.linalg.norm(p.b_bar) == pytest.approx(2.0)
    np.testing.assert_allclose(p.b_stars, np.tile(p.b_stars[0], (4, 1)))
    assert p.client_variance == pytest.approx(0.0, abs=1e-24)
    for i in range(4):
        x, y = p.features[i], p.targets[i]
        np.testing.assert_allclose(y, np.outer(x @ p.a_star, p.b_stars[i]), atol=1e-12)
        # RoLoRA Alg. 2 step 2 with a = a*: b~_i = Y_i^T X_i a / ||X_i a||^2 = b_i* (noiseless).
        xa = x @ p.a_star
        np.testing.assert_allclose(y.T @ xa / (xa @ xa), p.b_stars[i], atol=1e-10)


def test_rolora_heterogeneous_variance_and_mean():
    p = synthetic.rolora_linear(num_clients=8, num_samples=5, dim=4, heterogeneity=0.7, seed=1)
    dev = p.b_stars - p.b_stars.mean(axis=0)
    assert np.mean(np.sum(dev**2, axis=1)) == pytest.approx(0.49)
    assert p.client_variance == pytest.approx(0.49)
    assert np.linalg.norm(p.b_bar) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2 clients"):
        synthetic.rolora_linear(1, 5, 4, heterogeneity=0.1)


def test_fedrep_ground_truth_and_targets():
    p = synthetic.fedrep_linear(num_clients=6, num_samples=10, dim=8, rank=3, noise_std=0.0, seed=2)
    np.testing.assert_allclose(p.b_star.T @ p.b_star, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(p.w_stars, axis=1), np.sqrt(3))
    for i in range(6):
        expected = np.array([p.w_stars[i] @ p.b_star.T @ x for x in p.features[i]])
        np.testing.assert_allclose(p.targets[i], expected, atol=1e-12)


def test_fedrep_noise_level():
    p = synthetic.fedrep_linear(num_clients=50, num_samples=200, dim=5, rank=2, noise_std=0.5)
    clean = np.einsum("nmd,dk,nk->nm", p.features, p.b_star, p.w_stars)
    assert np.std(p.targets - clean) == pytest.approx(0.5, rel=0.05)


def test_resample_keeps_ground_truth_and_draws_fresh_data():
    p = synthetic.fedrep_linear(num_clients=3, num_samples=4, dim=5, rank=2, noise_std=0.0)
    q = p.resample(seed=11)
    r = p.resample(seed=11, num_samples=9)
    np.testing.assert_array_equal(q.b_star, p.b_star)
    np.testing.assert_array_equal(q.w_stars, p.w_stars)
    assert not np.allclose(q.features, p.features)
    assert r.features.shape == (3, 9, 5)
    np.testing.assert_array_equal(q.features, p.resample(seed=11).features)
    x, y = p.sample(7, seed=0)
    for i in range(3):
        for j in range(7):
            assert y[i, j] == pytest.approx(x[i, j] @ p.b_star @ p.w_stars[i], abs=1e-12)


def test_same_seed_same_problem():
    a = synthetic.adaptpfl_linear(5, 4, 6, 2, seed=9)
    b = synthetic.adaptpfl_linear(5, 4, 6, 2, seed=9)
    np.testing.assert_array_equal(a.targets, b.targets)
    np.testing.assert_array_equal(a.s_stars, b.s_stars)


def test_flute_default_spectrum_and_truncation():
    p = synthetic.flute_linear(num_clients=15, num_samples=12, dim=10, noise_std=0.0, seed=0)
    expected = 20.0 / (np.arange(1, 11) + 1.0)  # 2*d_/(i+1), d_ = min(10, 15) = 10
    np.testing.assert_allclose(np.linalg.svd(p.phi, compute_uv=False), expected, atol=1e-10)
    assert np.linalg.matrix_rank(p.phi) == 10
    for i in range(15):
        np.testing.assert_allclose(p.targets[i], p.features[i] @ p.phi[:, i], atol=1e-12)
    k = 4
    best = p.optimal_predictors(k)
    assert np.linalg.matrix_rank(best) == k
    # Eckart-Young: ||Phi - best||_F^2 = sum of the discarded squared singular values.
    assert np.linalg.norm(p.phi - best) ** 2 == pytest.approx(np.sum(expected[k:] ** 2))


def test_flute_given_spectrum_and_errors():
    p = synthetic.flute_linear(num_clients=6, num_samples=3, dim=8, singular_values=[1.0, 3.0, 2.0])
    np.testing.assert_allclose(np.linalg.svd(p.phi, compute_uv=False)[:3], [3.0, 2.0, 1.0])
    assert np.linalg.matrix_rank(p.phi) == 3
    with pytest.raises(ValueError, match="singular_values"):
        synthetic.flute_linear(num_clients=2, num_samples=3, dim=8, singular_values=[1, 1, 1])


@pytest.mark.parametrize("orthogonal", [False, True])
def test_adaptpfl_shortcuts(orthogonal):
    p = synthetic.adaptpfl_linear(
        num_clients=12, num_samples=20, dim=9, rank=3,
        shortcuts=synthetic.ShortcutTruth(alpha=0.25, shortcut_norm=0.8,
                                          orthogonal_to_heads=orthogonal), seed=4)
    np.testing.assert_allclose(p.b_star.T @ p.b_star, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(p.w_stars, axis=1), np.sqrt(3))
    np.testing.assert_allclose(p.s_stars @ p.b_star, 0.0, atol=1e-12)
    norms = np.linalg.norm(p.s_stars, axis=1)
    if orthogonal:
        assert norms.mean() == pytest.approx(0.8)
        np.testing.assert_allclose(p.s_stars.T @ p.w_stars, 0.0, atol=1e-12)  # S* W*^T = 0
    else:
        np.testing.assert_allclose(norms, 0.8)
    for i in range(12):
        theta = 0.75 * p.b_star @ p.w_stars[i] + 0.25 * p.s_stars[i]
        np.testing.assert_allclose(p.targets[i], p.features[i] @ theta, atol=1e-12)


def test_client_data_conversion():
    p = synthetic.fedrep_linear(num_clients=3, num_samples=4, dim=5, rank=2, seed=0)
    cd = p.client_data()
    assert cd.client_ids == ["client_000", "client_001", "client_002"]
    got = list(cd.create_tf_dataset_for_client("client_001").as_numpy_iterator())
    assert len(got) == 4
    for (x, y), j in zip(got, range(4)):
        np.testing.assert_allclose(x, p.features[1, j], rtol=1e-6)
        assert y == pytest.approx(p.targets[1, j], rel=1e-5)


def test_distance_helpers_measure_recovery():
    p = synthetic.fedrep_linear(num_clients=3, num_samples=4, dim=6, rank=2, seed=5)
    assert subspace.principal_angle_distance(p.b_star, p.b_star) == pytest.approx(0.0, abs=1e-12)
    r = synthetic.rolora_linear(2, 3, 6, seed=0)
    assert subspace.sin_theta(-r.a_star, r.a_star) == pytest.approx(0.0, abs=1e-12)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
