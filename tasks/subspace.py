"""Distances between directions and subspaces, for measuring recovery of synthetic ground truths.

* `sin_theta(u, v)` = |sin θ(u, v)| = ‖(I − ûûᵀ) v̂‖ for unit û = u/‖u‖, v̂ = v/‖v‖
  (RoLoRA Def. 5.2: the angle distance between a and a*).
* `principal_angle_distance(b_hat, b_star)` = ‖(I − Q*Q*ᵀ) Q̂‖₂ where Q̂, Q* are orthonormal bases
  of span(b_hat) (d×k) and span(b_star) (d×k*) (FedRep/SRPFL Def. 4.1). It lies in [0, 1], is 0
  iff span(b_hat) ⊆ span(b_star), and equals the sine of the largest principal angle when k = k*.

Example:

>>> e = np.eye(3)
>>> round(sin_theta(e[0], e[0] + e[1]), 6)
0.707107
>>> principal_angle_distance(e[:, :2], e[:, [1, 0]])
0.0
"""

import numpy as np


def orthonormalize(b: np.ndarray) -> np.ndarray:
    """Orthonormal basis Q (d×k) of the column span of b (d×k, or a vector of length d), by QR.

    Example:

    >>> q = orthonormalize(np.array([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]]))
    >>> np.allclose(q.T @ q, np.eye(2))
    True
    """
    b = np.asarray(b, dtype=np.float64)
    if b.ndim == 1:
        b = b[:, None]
    if b.ndim != 2 or b.shape[1] > b.shape[0]:
        raise ValueError(f"expected a d×k matrix with k <= d, got shape {b.shape}")
    q, _ = np.linalg.qr(b)
    return q


def sin_theta(u: np.ndarray, v: np.ndarray) -> float:
    """|sin θ(u, v)| = ‖(I − ûûᵀ)v̂‖ for non-zero vectors u, v of the same length.

    Example:

    >>> sin_theta(np.array([1.0, 0.0]), np.array([0.0, -2.0]))
    1.0
    """
    u = np.asarray(u, dtype=np.float64).ravel()
    v = np.asarray(v, dtype=np.float64).ravel()
    nu, nv = np.linalg.norm(u), np.linalg.norm(v)
    if nu == 0 or nv == 0:
        raise ValueError("sin_theta needs non-zero vectors")
    u, v = u / nu, v / nv
    return float(min(1.0, np.linalg.norm(v - u * (u @ v))))


def principal_angle_distance(b_hat: np.ndarray, b_star: np.ndarray) -> float:
    """dist(B̂, B*) = ‖(I − Q*Q*ᵀ) Q̂‖₂ with Q̂ = orth(B̂), Q* = orth(B*) (spectral norm).

    Args:
      b_hat: estimate, d×k (need not be orthonormal).
      b_star: ground truth, d×k*.

    Returns:
      A float in [0, 1].

    Example:

    >>> e = np.eye(4)
    >>> principal_angle_distance(e[:, :2], e[:, 2:])
    1.0
    """
    q_hat, q_star = orthonormalize(b_hat), orthonormalize(b_star)
    if q_hat.shape[0] != q_star.shape[0]:
        raise ValueError(f"dimension mismatch: {q_hat.shape} vs {q_star.shape}")
    residual = q_hat - q_star @ (q_star.T @ q_hat)
    return float(min(1.0, np.linalg.norm(residual, ord=2)))
