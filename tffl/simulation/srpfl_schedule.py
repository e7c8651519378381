"""What SRPFL's sampler (`tffl.simulation.srpfl`) is built from: per-round compute times, stage schedule.

Straggler models give every client's compute time 𝒯_i^t of round t as a pure function of
`(seed, round_num)`: `FixedExponentialTimes` (𝒯_i ~ Exp(λ), the same every round) and
`DynamicExponentialTimes` (λ_i ~ U[low, high] once, 𝒯_i^t ~ Exp(λ_i) every round). The stage
schedule is pure arithmetic: the stage sizes n_r = min(N, n0·2^r) (`stage_sizes`), the expected
order statistics E[𝒯_(n)] of Exp(λ) times (`expected_order_statistic`) and the stage lengths τ_r
of Lemma B.1 (`lemma_b1_stage_rounds`) (spec: `shared/specs/srpfl.md` §3–4).

Example:

>>> stage_sizes(8, 2), lemma_b1_stage_rounds(8, 2)[0]
([2, 4, 8], 11)
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

# Extra seed-sequence words, so that compute-time draws are independent of `UniformSampler`'s
# `(seed, round_num)` stream and of each other.
_FIXED_STREAM = 0x5F1
_RATES_STREAM = 0x5F2
_ROUND_STREAM = 0x5F3


class StragglerModel(Protocol):
    """Per-client compute times of one round: a pure function of `(seed, round_num)`."""

    def times(self, seed: int, round_num: int, num_clients: int) -> np.ndarray: ...


def _check_positive_rate(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value} must be a positive, finite rate (λ > 0)")
    return value


class FixedExponentialTimes:
    """Fixed speeds (srpfl.md §3.2, Figs 3 and 5): 𝒯_i ~ Exp(λ) i.i.d., drawn once per seed.

    Client i's compute time 𝒯_i (mean 1/λ) is the same in every round. The paper's experiments use
    λ = 1. (The theory of §3.1 redraws i.i.d. Exp(λ) times at every stage; for per-round i.i.d.
    draws use `DynamicExponentialTimes(rate_low=λ, rate_high=λ)`.)

    Example:

    >>> FixedExponentialTimes(rate=2.0).times(seed=0, round_num=1, num_clients=3).shape
    (3,)
    """

    def __init__(self, rate: float = 1.0):
        self.rate = _check_positive_rate("rate", rate)

    def times(self, seed: int, round_num: int, num_clients: int) -> np.ndarray:
        del round_num  # fixed for the whole run
        rng = np.random.default_rng((seed, _FIXED_STREAM))
        return rng.exponential(1.0 / self.rate, size=num_clients)

    def __repr__(self) -> str:
        return f"FixedExponentialTimes(rate={self.rate})"


class DynamicExponentialTimes:
    """Dynamic speeds (srpfl.md §3.2, Figs 4 and 6): λ_i ~ U[low, high] once, 𝒯_i^t ~ Exp(λ_i).

    The paper draws each client's rate λ_i ~ Uniform[1/N, 1] once (`rate_low=None` means 1/N)
    and redraws every client's time from Exp(λ_i) (mean 1/λ_i) at every round. (The official code
    instead draws the mean 1/λ_i ~ U[1, 100]; srpfl.md §3.2 and §8.2 recommend the paper's form.)
    With `rate_low == rate_high == λ` this is i.i.d. Exp(λ) redrawn every round, the §3.1 model.

    Example:

    >>> model = DynamicExponentialTimes()
    >>> bool(np.all(model.rates(seed=0, num_clients=4) >= 0.25))
    True
    """

    def __init__(self, rate_low: float | None = None, rate_high: float = 1.0):
        self.rate_low = None if rate_low is None else _check_positive_rate("rate_low", rate_low)
        self.rate_high = _check_positive_rate("rate_high", rate_high)
        if self.rate_low is not None and self.rate_low > self.rate_high:
            raise ValueError(
                f"rate_low={self.rate_low} must not exceed rate_high={self.rate_high}"
            )

    def rates(self, seed: int, num_clients: int) -> np.ndarray:
        """Per-client rates λ_i ~ U[rate_low, rate_high] (rate_low defaults to 1/N)."""
        low = 1.0 / num_clients if self.rate_low is None else self.rate_low
        if low > self.rate_high:
            raise ValueError(
                f"rate_low=1/N={low} exceeds rate_high={self.rate_high}; pass rate_low"
            )
        rng = np.random.default_rng((seed, _RATES_STREAM))
        return rng.uniform(low, self.rate_high, size=num_clients)

    def times(self, seed: int, round_num: int, num_clients: int) -> np.ndarray:
        rates = self.rates(seed, num_clients)
        rng = np.random.default_rng((seed, _ROUND_STREAM, round_num))
        return rng.exponential(1.0, size=num_clients) / rates

    def __repr__(self) -> str:
        return f"DynamicExponentialTimes(rate_low={self.rate_low}, rate_high={self.rate_high})"


def expected_order_statistic(n: int, num_clients: int, rate: float = 1.0) -> float:
    """E[𝒯_(n)], the n-th smallest of N i.i.d. Exp(λ) times (srpfl.md §3.1, §4.7, §8.5).

        E[𝒯_(n)] = (1/λ) Σ_{j=N−n+1}^{N} 1/j = (H_N − H_{N−n}) / λ,   0 ≤ n ≤ N.

    Example:

    >>> round(expected_order_statistic(10, 100), 3)
    0.105
    """
    if not 0 <= n <= num_clients:
        raise ValueError(f"n={n} must be between 0 and num_clients={num_clients}")
    rate = _check_positive_rate("rate", rate)
    return sum(1.0 / j for j in range(num_clients - n + 1, num_clients + 1)) / rate


def stage_sizes(num_clients: int, initial_participants: int) -> list[int]:
    """Participants per stage, n_r = min(N, n0·2^r), ending at the first stage with n_r = N.

    Example:

    >>> stage_sizes(100, 10)
    [10, 20, 40, 80, 100]
    """
    _check_sizes(num_clients, initial_participants)
    sizes = [initial_participants]
    while sizes[-1] < num_clients:
        sizes.append(min(num_clients, 2 * sizes[-1]))
    return sizes


def lemma_b1_stage_rounds(
    num_clients: int, initial_participants: int, a: float = 0.25
) -> list[int]:
    """Rounds τ_r of every stage but the last, from Lemma B.1 (srpfl.md §4.5, paper eq. 195).

    With E_n := E[𝒯_(n)] for Exp(λ) times (`expected_order_statistic`; λ cancels) and the
    contraction constant a of Theorem 4.5 (a = ½ η E0 σ̄²_min ≤ 1/4),

        t^r = 2 log( √2 (E_{n_{r+1}} − E_{n_r}) / (E_{n_r} − E_{n_{r−1}}) ) / log(1/(1−a)),

    and τ_r = max(1, ⌈t^r⌉) (the fewest whole rounds satisfying the lemma's t^r ≥ … bound).
    Choices the paper leaves open:

    * stage 0 has no n_{−1} (X_0 = +∞): it uses the §4.5 early-stage bound on the gap ratio,
      (E_{n_1} − E_{n_0}) / (E_{n_0} − E_{n_{−1}}) ≤ 3, i.e. t^0 = 2 log(3√2) / log(1/(1−a));
    * the stage before the last uses the capped size n_{r+1} = N (= min(N, 2 n_r));
    * the last stage (n = N) is open-ended and is not in the list; the paper's
      2 log(1/(ĉ−1)) / log(1/(1−a)) (eq. 232) is only how long it needs to reach ε.

    For a = 1/4, N = 100, n0 = 10 this gives [11, 9, 12, 11] (early stages ≈ 10, cf. the code's
    `double_freq = 10`).

    Example:

    >>> lemma_b1_stage_rounds(100, 10)
    [11, 9, 12, 11]
    """
    sizes = stage_sizes(num_clients, initial_participants)
    a = float(a)
    if not 0 < a < 1:
        raise ValueError(f"a={a} must be in (0, 1) (Theorem 4.5 has 0 < a ≤ 1/4)")
    log_rate = math.log(1.0 / (1.0 - a))
    expected = [expected_order_statistic(n, num_clients) for n in sizes]
    rounds = []
    for r in range(len(sizes) - 1):
        if r == 0:
            ratio = 3.0
        else:
            ratio = (expected[r + 1] - expected[r]) / (expected[r] - expected[r - 1])
        t = 2.0 * math.log(math.sqrt(2.0) * ratio) / log_rate
        rounds.append(max(1, math.ceil(t)))
    return rounds


def _check_sizes(num_clients: int, initial_participants: int) -> None:
    if isinstance(initial_participants, bool) or not isinstance(
        initial_participants, (int, np.integer)
    ):
        raise ValueError(f"initial_participants={initial_participants!r} must be an int")
    if num_clients < 1:
        raise ValueError(f"num_clients={num_clients} must be at least 1")
    if initial_participants < 1:
        raise ValueError(f"initial_participants={initial_participants} must be at least 1")
    if initial_participants > num_clients:
        raise ValueError(
            f"initial_participants={initial_participants} exceeds the number of clients "
            f"N={num_clients}"
        )
