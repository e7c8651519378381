"""Synthetic federated regression problems from the papers' theory, with their ground truths.

Every generator returns a frozen dataclass holding the ground truth, the clients' data
`features` X of shape (N, m, d) with i.i.d. N(0, 1) entries and `targets` Y, and methods:

* `resample(seed, num_samples=None)`: the same ground truth with fresh samples (for the
  "fresh samples per round" analyses of FedRep/SRPFL/AdaptPFL);
* `client_data()`: a `tff.simulation.datasets.ClientData` yielding (x, y) float32 pairs, client i
  holding its m rows.

Models (z ~ N(0, σ²) independent noise, σ = `noise_std`):

* `rolora_linear` (RoLoRA §5.1, A.5): Y_i = X_i a* b_i*ᵀ + Z_i, Y_i ∈ R^{m×d}; a* a unit vector,
  b_i* = b̄* + e_i with Σ_i e_i = 0 and (1/N)Σ‖e_i‖² = γ² (`heterogeneity` γ; γ = 0 is the
  homogeneous model b_i* = b*).
* `fedrep_linear` (FedRep/SRPFL §4.1): y = w_i*ᵀ B*ᵀ x + z, B* ∈ R^{d×k} orthonormal,
  ‖w_i*‖ = √k (Assumption 4.4).
* `flute_linear` (FLUTE §1.3, App. C.1): y = φ_iᵀ x + z, Φ = [φ_1..φ_M] = U diag(λ) Vᵀ with a
  given spectrum λ (default λ_i = 2d̲/(i+1), d̲ = min(d, M)); under-parameterized for k < rank Φ.
  `optimal_predictors(k)` is the rank-k truncated SVD U_k Λ_k V_kᵀ (Eckart–Young).
* `adaptpfl_linear` (AdaptPFL §2.1, §2.7): y = xᵀθ_i* + z, θ_i* = (1−α) B* w_i* + α s_i*, with
  s_i* ⊥ span(B*), ‖s_i*‖ = C_s; optionally S*W*ᵀ = Σ_i s_i* w_i*ᵀ = 0 (one global rescaling so the
  mean ‖s_i*‖ is C_s).

Example:

>>> p = fedrep_linear(num_clients=4, num_samples=5, dim=6, rank=2, seed=0)
>>> p.features.shape, p.targets.shape, p.b_star.shape
((4, 5, 6), (4, 5), (6, 2))
"""

import dataclasses

import numpy as np

from tasks import client_data as client_data_lib
from tasks import subspace


def _random_orthonormal(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Q factor of a rows×cols standard Gaussian matrix (cols <= rows), orthonormal columns."""
    return subspace.orthonormalize(rng.standard_normal((rows, cols)))


def _check_dims(num_clients: int, num_samples: int, dim: int) -> None:
    for name, value in (("num_clients", num_clients), ("num_samples", num_samples), ("dim", dim)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


@dataclasses.dataclass(frozen=True)
class _Synthetic:
    """Shared data fields and methods; subclasses define `_clean_targets`."""

    features: np.ndarray  # (N, m, d)
    targets: np.ndarray  # (N, m) or (N, m, d_out)
    noise_std: float

    @property
    def num_clients(self) -> int:
        return self.features.shape[0]

    def _clean_targets(self, features: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sample(self, num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh (X, Y) for every client, same ground truth: shapes (N, m, d), (N, m, ...)."""
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((self.num_clients, num_samples, self.features.shape[2]))
        y = self._clean_targets(x)
        return x, y + self.noise_std * rng.standard_normal(y.shape)

    def resample(self, seed: int, num_samples: int | None = None):
        """A copy with fresh features and targets (same ground truth)."""
        x, y = self.sample(num_samples or self.features.shape[1], seed)
        return dataclasses.replace(self, features=x, targets=y)

    def client_data(self) -> client_data_lib.ArrayClientData:
        """ClientData `client_000`.. yielding (x float32 (d,), y float32) per sample."""
        n, m, d = self.features.shape
        flat_x = self.features.reshape(n * m, d).astype(np.float32)
        flat_y = self.targets.reshape((n * m,) + self.targets.shape[2:]).astype(np.float32)
        width = max(3, len(str(n - 1)))
        parts = {f"client_{i:0{width}d}": np.arange(i * m, (i + 1) * m) for i in range(n)}
        return client_data_lib.ArrayClientData(flat_x, flat_y, parts)


@dataclasses.dataclass(frozen=True)
class RankOneLinear(_Synthetic):
    """RoLoRA's rank-1 model Y_i = X_i a* b_i*ᵀ (+ noise). a_star: (d,), b_stars: (N, d)."""

    a_star: np.ndarray
    b_stars: np.ndarray

    @property
    def b_bar(self) -> np.ndarray:
        """b̄* = (1/N) Σ_i b_i*, the global minimizer's b (with a = a*)."""
        return self.b_stars.mean(axis=0)

    @property
    def client_variance(self) -> float:
        """γ² = (1/N) Σ_i ‖b_i* − b̄*‖² (RoLoRA Def. A.13)."""
        return float(np.mean(np.sum((self.b_stars - self.b_bar) ** 2, axis=1)))

    def _clean_targets(self, features):
        # (N, m, d) @ (d,) -> (N, m); outer product with b_i* -> (N, m, d)
        return np.einsum("nm,nd->nmd", features @ self.a_star, self.b_stars)


def rolora_linear(
    num_clients: int,
    num_samples: int,
    dim: int,
    heterogeneity: float = 0.0,
    b_norm: float = 1.0,
    noise_std: float = 0.0,
    seed: int = 0,
) -> RankOneLinear:
    """RoLoRA's linear rank-1 clients: Y_i = X_i a* b_i*ᵀ + Z_i, X_i ∈ R^{m×d} i.i.d. N(0, 1).

    a* is a uniformly random unit vector; b̄* a random direction of norm `b_norm`; the deviations
    e_i = b_i* − b̄* are centred Gaussian vectors rescaled so that (1/N)Σ‖e_i‖² = γ² exactly.

    Args:
      num_clients: N (N >= 2 when heterogeneity > 0).
      num_samples: m, samples per client.
      dim: d.
      heterogeneity: γ >= 0 (0: homogeneous, all b_i* = b*).
      b_norm: ‖b̄*‖.
      noise_std: σ of the entrywise target noise (the paper's model is noiseless).
      seed: seed of everything.

    Returns:
      RankOneLinear with features (N, m, d) and targets (N, m, d).

    Example:

    >>> p = rolora_linear(num_clients=3, num_samples=4, dim=5, heterogeneity=0.5, seed=1)
    >>> round(p.client_variance, 6), round(float(np.linalg.norm(p.a_star)), 6)
    (0.25, 1.0)
    """
    _check_dims(num_clients, num_samples, dim)
    if heterogeneity < 0:
        raise ValueError(f"heterogeneity must be >= 0, got {heterogeneity}")
    if heterogeneity > 0 and num_clients < 2:
        raise ValueError("heterogeneous b_i* need at least 2 clients")
    rng = np.random.default_rng(seed)
    a_star = rng.standard_normal(dim)
    a_star /= np.linalg.norm(a_star)
    b_bar = rng.standard_normal(dim)
    b_bar *= b_norm / np.linalg.norm(b_bar)
    b_stars = np.tile(b_bar, (num_clients, 1))
    if heterogeneity > 0:
        e = rng.standard_normal((num_clients, dim))
        e -= e.mean(axis=0)
        e *= heterogeneity / np.sqrt(np.mean(np.sum(e**2, axis=1)))
        b_stars = b_stars + e
    proto = RankOneLinear(np.zeros((num_clients, 0, dim)), None, noise_std, a_star, b_stars)
    x, y = proto.sample(num_samples, int(rng.integers(2**31)))
    return dataclasses.replace(proto, features=x, targets=y)


@dataclasses.dataclass(frozen=True)
class LowRankLinear(_Synthetic):
    """FedRep/SRPFL model y = w_i*ᵀ B*ᵀ x + z. b_star: (d, k) orthonormal, w_stars: (N, k)."""

    b_star: np.ndarray
    w_stars: np.ndarray

    def _clean_targets(self, features):
        return np.einsum("nmd,dk,nk->nm", features, self.b_star, self.w_stars)


def fedrep_linear(
    num_clients: int,
    num_samples: int,
    dim: int,
    rank: int,
    noise_std: float = 1e-3,
    seed: int = 0,
) -> LowRankLinear:
    """FedRep/SRPFL low-rank representation clients: y = w_i*ᵀ B*ᵀ x + z.

    B* = Q factor of a d×k Gaussian; w_i* ~ N(0, I_k) rescaled to ‖w_i*‖ = √k (Assumption 4.4).

    Args:
      num_clients: N.
      num_samples: m per client (use `resample` for fresh samples each round).
      dim: d.
      rank: k <= d.
      noise_std: σ of z.
      seed: seed of everything.

    Returns:
      LowRankLinear with features (N, m, d), targets (N, m).

    Example:

    >>> p = fedrep_linear(num_clients=3, num_samples=2, dim=4, rank=2, seed=0)
    >>> np.allclose(np.linalg.norm(p.w_stars, axis=1), np.sqrt(2))
    True
    """
    _check_dims(num_clients, num_samples, dim)
    if not 1 <= rank <= dim:
        raise ValueError(f"rank must be in [1, dim={dim}], got {rank}")
    rng = np.random.default_rng(seed)
    b_star = _random_orthonormal(rng, dim, rank)
    w = rng.standard_normal((num_clients, rank))
    w *= np.sqrt(rank) / np.linalg.norm(w, axis=1, keepdims=True)
    proto = LowRankLinear(np.zeros((num_clients, 0, dim)), None, noise_std, b_star, w)
    x, y = proto.sample(num_samples, int(rng.integers(2**31)))
    return dataclasses.replace(proto, features=x, targets=y)


@dataclasses.dataclass(frozen=True)
class UnderParameterizedLinear(_Synthetic):
    """FLUTE model y = φ_iᵀ x + z with Φ = U diag(λ) Vᵀ (d×M); phi[:, i] = φ_i."""

    phi: np.ndarray
    u: np.ndarray
    singular_values: np.ndarray
    v: np.ndarray

    def _clean_targets(self, features):
        return np.einsum("nmd,dn->nm", features, self.phi)

    def optimal_predictors(self, k: int) -> np.ndarray:
        """B*W* = U_k Λ_k V_kᵀ (d×M): the best rank-k fit of Φ; column i is client i's predictor."""
        return self.u[:, :k] @ np.diag(self.singular_values[:k]) @ self.v[:, :k].T


def flute_linear(
    num_clients: int,
    num_samples: int,
    dim: int,
    singular_values=None,
    noise_std: float = float(np.sqrt(0.3)),
    seed: int = 0,
) -> UnderParameterizedLinear:
    """FLUTE's under-parameterized linear clients: y = φ_iᵀ x + z, Φ = U diag(λ) Vᵀ.

    U (d×r) and V (M×r) have random orthonormal columns; λ is the given spectrum (sorted
    descending), r = len(λ) <= min(d, M) = d̲; by default λ_i = 2d̲/(i+1), i = 1..d̲ (App. C.1).

    Args:
      num_clients: M.
      num_samples: N samples per client.
      dim: d.
      singular_values: the spectrum λ (positive), or None for the default.
      noise_std: σ of ξ (App. C.1 uses variance 0.3, the default).
      seed: seed of everything.

    Returns:
      UnderParameterizedLinear with features (M, N, d), targets (M, N), phi (d, M).

    Example:

    >>> p = flute_linear(num_clients=12, num_samples=4, dim=10, seed=0)
    >>> np.round(np.linalg.svd(p.phi, compute_uv=False)[:3], 3).tolist()
    [10.0, 6.667, 5.0]
    """
    _check_dims(num_clients, num_samples, dim)
    rank_cap = min(dim, num_clients)
    if singular_values is None:
        lam = 2.0 * rank_cap / (np.arange(1, rank_cap + 1) + 1.0)
    else:
        lam = np.sort(np.asarray(singular_values, dtype=np.float64))[::-1]
        if lam.ndim != 1 or not 1 <= len(lam) <= rank_cap or lam.min() <= 0:
            raise ValueError(
                f"singular_values must be 1..{rank_cap} positive numbers, got {singular_values}"
            )
    rng = np.random.default_rng(seed)
    r = len(lam)
    u = _random_orthonormal(rng, dim, r)
    v = _random_orthonormal(rng, num_clients, r)
    phi = u @ np.diag(lam) @ v.T
    proto = UnderParameterizedLinear(
        np.zeros((num_clients, 0, dim)), None, noise_std, phi, u, lam, v
    )
    x, y = proto.sample(num_samples, int(rng.integers(2**31)))
    return dataclasses.replace(proto, features=x, targets=y)


@dataclasses.dataclass(frozen=True)
class ShortcutLinear(_Synthetic):
    """AdaptPFL model: θ_i* = (1−α) B* w_i* + α s_i*; thetas: (N, d), s_stars: (N, d)."""

    b_star: np.ndarray
    w_stars: np.ndarray
    s_stars: np.ndarray
    alpha: float

    @property
    def thetas(self) -> np.ndarray:
        """Per-client regressors θ_i*, shape (N, d)."""
        return (1 - self.alpha) * self.w_stars @ self.b_star.T + self.alpha * self.s_stars

    def _clean_targets(self, features):
        return np.einsum("nmd,nd->nm", features, self.thetas)


@dataclasses.dataclass(frozen=True)
class ShortcutTruth:
    """How `adaptpfl_linear` draws the ground truth's shortcut part α s_i* (the draft's §2.1).

    Attributes:
      alpha: the mixing weight α in [0, 1] of θ_i* = (1−α) B* w_i* + α s_i*.
      shortcut_norm: C_s, every ‖s_i*‖ (with `orthogonal_to_heads`: their mean).
      orthogonal_to_heads: enforce S*W*ᵀ = Σ_i s_i* w_i*ᵀ = 0.
    """

    alpha: float = 0.3
    shortcut_norm: float = 1.0
    orthogonal_to_heads: bool = False


def adaptpfl_linear(
    num_clients: int,
    num_samples: int,
    dim: int,
    rank: int,
    shortcuts: ShortcutTruth = ShortcutTruth(),
    noise_std: float = 0.0,
    seed: int = 0,
) -> ShortcutLinear:
    """AdaptPFL shared-plus-shortcut clients: y = xᵀ((1−α) B* w_i* + α s_i*) + z.

    B* orthonormal d×k, ‖w_i*‖ = √k. Shortcuts lie in span(B*)^⊥ (C_s = `shortcut_norm`):
    * default: s_i* = C_s P⊥g_i / ‖P⊥g_i‖, g_i ~ N(0, I_d), so every ‖s_i*‖ = C_s;
    * `orthogonal_to_heads`: S = B⊥ G̃ᵀ with G̃ (N×(d−k)) Gaussian projected off the column span
      of W* (N×k), so Σ_i s_i* w_i*ᵀ = 0, then one global scale so that mean_i ‖s_i*‖ = C_s.

    Args:
      num_clients: N (> rank when orthogonal_to_heads).
      num_samples: m per client.
      dim: d.
      rank: k < d.
      shortcuts: α, C_s and whether S*W*ᵀ = 0 (`ShortcutTruth`; default α = 0.3, C_s = 1).
      noise_std: σ of z (the draft's model is noiseless).
      seed: seed of everything.

    Returns:
      ShortcutLinear with features (N, m, d), targets (N, m).

    Example:

    >>> p = adaptpfl_linear(num_clients=5, num_samples=3, dim=6, rank=2,
    ...                     shortcuts=ShortcutTruth(alpha=0.3, shortcut_norm=1.0), seed=0)
    >>> bool(np.allclose(p.s_stars @ p.b_star, 0))
    True
    """
    alpha, shortcut_norm = shortcuts.alpha, shortcuts.shortcut_norm
    orthogonal_to_heads = shortcuts.orthogonal_to_heads
    _check_dims(num_clients, num_samples, dim)
    if not 1 <= rank < dim:
        raise ValueError(f"rank must be in [1, dim={dim}), got {rank}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if orthogonal_to_heads and num_clients <= rank:
        raise ValueError(f"orthogonal_to_heads needs num_clients > rank ({num_clients} <= {rank})")
    rng = np.random.default_rng(seed)
    full = _random_orthonormal(rng, dim, dim)
    b_star, b_perp = full[:, :rank], full[:, rank:]
    w = rng.standard_normal((num_clients, rank))
    w *= np.sqrt(rank) / np.linalg.norm(w, axis=1, keepdims=True)
    g = rng.standard_normal((num_clients, dim - rank))
    if orthogonal_to_heads:
        q_w = subspace.orthonormalize(w)
        g = g - q_w @ (q_w.T @ g)
        s = g @ b_perp.T
        s *= shortcut_norm / np.mean(np.linalg.norm(s, axis=1))
    else:
        s = g @ b_perp.T
        s *= shortcut_norm / np.linalg.norm(s, axis=1, keepdims=True)
    proto = ShortcutLinear(np.zeros((num_clients, 0, dim)), None, noise_std, b_star, w, s, alpha)
    x, y = proto.sample(num_samples, int(rng.integers(2**31)))
    return dataclasses.replace(proto, features=x, targets=y)
