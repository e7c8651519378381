"""Tests for tasks.subspace against closed forms and scipy's principal angles."""

import sys

import numpy as np
import pytest
from scipy import linalg

from tasks import subspace


@pytest.mark.parametrize("theta", [0.0, 0.3, np.pi / 4, 1.2, np.pi / 2, 2.5])
def test_sin_theta_closed_form_in_a_plane(theta):
    rng = np.random.default_rng(0)
    q = subspace.orthonormalize(rng.standard_normal((6, 2)))
    u = 3.0 * q[:, 0]
    v = 0.5 * (np.cos(theta) * q[:, 0] + np.sin(theta) * q[:, 1])
    assert subspace.sin_theta(u, v) == pytest.approx(abs(np.sin(theta)), abs=1e-12)
    assert subspace.sin_theta(v, u) == pytest.approx(abs(np.sin(theta)), abs=1e-12)


def test_sin_theta_rejects_zero_vector():
    with pytest.raises(ValueError, match="non-zero"):
        subspace.sin_theta(np.zeros(3), np.ones(3))


def test_orthonormalize_spans_same_space():
    rng = np.random.default_rng(1)
    b = rng.standard_normal((7, 3))
    q = subspace.orthonormalize(b)
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-12)
    # b lies in span(q): projecting leaves it unchanged.
    np.testing.assert_allclose(q @ (q.T @ b), b, atol=1e-12)
    assert subspace.orthonormalize(np.ones(4)).shape == (4, 1)
    with pytest.raises(ValueError, match="k <= d"):
        subspace.orthonormalize(np.ones((2, 3)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_principal_angle_distance_is_sine_of_largest_angle(seed):
    rng = np.random.default_rng(seed)
    b_star = rng.standard_normal((10, 3))
    b_hat = b_star + 0.3 * rng.standard_normal((10, 3))
    expected = np.sin(linalg.subspace_angles(b_hat, b_star).max())
    assert subspace.principal_angle_distance(b_hat, b_star) == pytest.approx(expected, abs=1e-10)
    assert subspace.principal_angle_distance(b_star, b_hat) == pytest.approx(expected, abs=1e-10)


def test_principal_angle_distance_extremes_and_basis_invariance():
    rng = np.random.default_rng(3)
    b = rng.standard_normal((8, 2))
    mix = np.array([[2.0, 1.0], [0.5, -3.0]])  # invertible change of basis
    assert subspace.principal_angle_distance(b @ mix, b) == pytest.approx(0.0, abs=1e-12)
    e = np.eye(8)
    assert subspace.principal_angle_distance(e[:, :2], e[:, 2:5]) == pytest.approx(1.0)
    # Rotating one basis vector by theta towards an orthogonal direction gives dist = sin(theta).
    theta = 0.4
    rotated = np.stack([np.cos(theta) * e[:, 0] + np.sin(theta) * e[:, 5], e[:, 1]], axis=1)
    assert subspace.principal_angle_distance(rotated, e[:, :2]) == pytest.approx(np.sin(theta))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
