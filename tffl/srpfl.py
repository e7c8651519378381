"""SRPFL's straggler-resilient participation as a client sampler, with simulated wall-clock.

SRPFL (Tziotis et al., "Straggler-Resilient Personalized Federated Learning"; spec:
`shared/specs/srpfl.md`) wraps an alternating-update subroutine such as FedRep. Of the N sampled
clients only the fastest n take part in a round; n starts at n0 and doubles after each stage,
n ← min(N, 2n) (srpfl.md §2.1–2.2). Stage r therefore has

    n_r = min(N, n0 · 2^r),   r = 0, 1, …, ⌈log2(N / n0)⌉,

and lasts τ_r rounds; the last stage (n = N) runs until the round budget ends (§8.2).

Wall-clock (srpfl.md §3): a synchronous round costs the time of its slowest participant plus a
communication cost 𝒞, so with per-round compute times 𝒯_1^t, …, 𝒯_N^t

    round_wall_clock(t) = max_{i ∈ fastest n_r at round t} 𝒯_i^t + 𝒞 = 𝒯^t_(n_r) + 𝒞,
    simulated_time(t)   = Σ_{s=1}^{t} round_wall_clock(s).

Compute times come from a straggler model (`FixedExponentialTimes`, `DynamicExponentialTimes`)
and are a pure function of `(seed, round_num)`, so a resumed run reports the same clients and the
same clock. `FullParticipationClock` is the FedRep baseline of the same population: all N take
part every round and every round waits for the slowest, 𝒯^t_(N) + 𝒞 (§3.1, "Wall-clock of
FedRep").

Example:

>>> sampler = SrpflSampler([f"c{i}" for i in range(8)], initial_participants=2, seed=0,
...                        stage_rounds=3, communication_cost=0.5)
>>> [sampler.sample(t).info["participants"] for t in range(1, 11)]
[2, 2, 2, 4, 4, 4, 8, 8, 8, 8]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tffl.participation import Participation

# Extra seed-sequence words, so that compute-time draws are independent of `UniformSampler`'s
# `(seed, round_num)` stream and of each other.
_FIXED_STREAM = 0x5F1
_RATES_STREAM = 0x5F2
_ROUND_STREAM = 0x5F3
_POOL_STREAM = 0x5F4


def draw_pool(seed: int, round_num: int, population: int, pool: int | None) -> np.ndarray:
    """The N clients (indices into the M-client population) that round `round_num` draws before
    the fastest are picked: N of M uniformly at random without replacement, redrawn every round
    (srpfl.md §2.4, "partial participation"; the paper's Figs 5–6 use N = M/5); everyone, in
    order, when `pool` is None or M. A pure function of `(seed, round_num)`.

    >>> draw_pool(0, 1, 5, None).tolist()
    [0, 1, 2, 3, 4]
    >>> len(set(draw_pool(0, 1, 100, 20).tolist()))
    20
    """
    check_pool(population, pool)
    if pool is None or pool == population:
        return np.arange(population)
    rng = np.random.default_rng((seed, _POOL_STREAM, round_num))
    return np.sort(rng.choice(population, size=pool, replace=False))


def check_pool(population: int, pool: int | None) -> int:
    """N, the pool size (`pool`, or the population M when None); a one-line error unless
    1 ≤ N ≤ M."""
    if pool is None:
        return population
    if isinstance(pool, bool) or not isinstance(pool, (int, np.integer)) or pool < 1:
        raise ValueError(f"srpfl pool={pool!r} must be an int >= 1")
    if pool > population:
        raise ValueError(f"srpfl pool={pool} exceeds the population of {population} clients; "
                         f"choose a pool of at most {population}")
    return int(pool)


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


def _check_communication_cost(cost: float) -> float:
    cost = float(cost)
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"communication_cost={cost} must be a finite number >= 0")
    return cost


def _check_round(round_num: int) -> None:
    if round_num < 1:
        raise ValueError(f"round_num={round_num} must be at least 1 (rounds are numbered 1, 2, …)")


class _Clock:
    """Cumulative wall-clock Σ_{s=1}^{t} round_wall_clock(s), cached; pure in (seed, t)."""

    def __init__(self, round_wall_clock):
        self._round_wall_clock = round_wall_clock
        self._cumulative = [0.0]  # _cumulative[t] = simulated time after round t

    def __call__(self, round_num: int) -> float:
        _check_round(round_num)
        while len(self._cumulative) <= round_num:
            t = len(self._cumulative)
            self._cumulative.append(self._cumulative[-1] + self._round_wall_clock(t))
        return self._cumulative[round_num]


class SrpflSampler:
    """The fastest n of N clients each round, n doubling per stage (srpfl.md §2.2, Algorithm 1).

    Round t (1-based) of stage r uses the n_r = min(N, n0·2^r) clients with the smallest compute
    times 𝒯_i^t of that round (Remark 3.2: the first n_r models to arrive), listed fastest first.
    Stage r lasts τ_r rounds; the last stage (n = N) lasts until the run ends. `info` per round:

    * `participants`: n_r;
    * `stage`: r;
    * `round_wall_clock`: 𝒯^t_(n_r) + 𝒞, the slowest selected client's time plus the
      communication cost (§3, §8.1 item 4; charged per round as the paper states, not per 10
      rounds as the code's plots do);
    * `simulated_time`: Σ_{s=1}^{t} round_wall_clock(s).

    The pool (`pool`): by default all clients are the pool every round (M = N, full participation
    in the paper's terms). With `pool=N < M`, each round first draws N of the M clients uniformly
    at random (`draw_pool`, the paper's partial participation, Figs 5–6: N = M/5) and the fastest
    n_r = min(N, n0·2^r) of those N take part; the stages then end at n = N. `info` also has
    `pool` (N).

    Args:
      client_ids: the M clients of the population.
      initial_participants: n0, 1 ≤ n0 ≤ N.
      seed: base seed of the compute times.
      straggler_model: `FixedExponentialTimes()` (default, the paper's fixed speeds, λ = 1) or
        `DynamicExponentialTimes()`, or anything with `times(seed, round_num, num_clients)`.
      stage_rounds: τ for every stage (an int > 0; the code's default is 10), a sequence of
        per-stage τ_r for at least all stages but the last, or `"lemma_b1"` for
        `lemma_b1_stage_rounds(N, n0, lemma_b1_a)`.
      communication_cost: 𝒞 ≥ 0 added to every round (the paper's Fig. 3 uses 0, 10, 100).
      lemma_b1_a: the contraction constant a of Theorem 4.5, used by `"lemma_b1"`.
      pool: N, the clients drawn per round before the fastest are picked (default: all M).

    Example:

    >>> sampler = SrpflSampler(["a", "b", "c", "d"], initial_participants=1, seed=0,
    ...                        stage_rounds=2)
    >>> [sampler.participants(t) for t in range(1, 7)], sampler.stage(5)
    ([1, 1, 2, 2, 4, 4], 2)
    """

    def __init__(
        self,
        client_ids: Sequence[str],
        initial_participants: int,
        seed: int,
        straggler_model: StragglerModel | None = None,
        stage_rounds: int | Sequence[int] | str = 10,
        communication_cost: float = 0.0,
        lemma_b1_a: float = 0.25,
        pool: int | None = None,
    ):
        self.client_ids = list(client_ids)
        if not self.client_ids:
            raise ValueError("SrpflSampler needs at least one client id")
        if len(set(self.client_ids)) != len(self.client_ids):
            raise ValueError("SrpflSampler client ids must be distinct")
        self.pool = check_pool(len(self.client_ids), pool)
        num_clients = self.pool
        self.sizes = stage_sizes(num_clients, initial_participants)
        self.initial_participants = initial_participants
        self.seed = seed
        self.straggler_model = straggler_model or FixedExponentialTimes()
        self.communication_cost = _check_communication_cost(communication_cost)
        self.stage_rounds = self._resolve_stage_rounds(stage_rounds, lemma_b1_a)
        # stage_ends[r] = last round of stage r, for every stage but the last.
        self._stage_ends = list(np.cumsum(self.stage_rounds, dtype=np.int64).tolist())
        self._clock = _Clock(self.round_wall_clock)

    def _resolve_stage_rounds(self, stage_rounds, lemma_b1_a) -> list[int]:
        finite = len(self.sizes) - 1  # stages with a fixed length
        if isinstance(stage_rounds, str):
            if stage_rounds != "lemma_b1":
                raise ValueError(
                    f"stage_rounds={stage_rounds!r} must be an int, a sequence of ints or "
                    "'lemma_b1'"
                )
            return lemma_b1_stage_rounds(self.pool, self.initial_participants, lemma_b1_a)
        single = isinstance(stage_rounds, (int, np.integer))
        values = [stage_rounds] * max(finite, 1) if single else list(stage_rounds)
        for tau in values:
            if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau <= 0:
                raise ValueError(f"stage_rounds={stage_rounds!r}: every τ must be an int > 0")
        if len(values) < finite:
            raise ValueError(
                f"stage_rounds={stage_rounds!r} gives {len(values)} stage lengths; the "
                f"{len(self.sizes)} stages {self.sizes} need at least {finite}"
            )
        return [int(tau) for tau in values[:finite]]

    def stage(self, round_num: int) -> int:
        """r such that round `round_num` is in stage r (stages have τ_0, τ_1, … rounds)."""
        _check_round(round_num)
        return int(np.searchsorted(self._stage_ends, round_num, side="left"))

    def participants(self, round_num: int) -> int:
        """n_r = min(N, n0·2^r) for the stage r of `round_num`."""
        return self.sizes[self.stage(round_num)]

    def compute_times(self, round_num: int) -> np.ndarray:
        """𝒯_i^t of every client (in `client_ids` order) at round `round_num`."""
        _check_round(round_num)
        times = np.asarray(
            self.straggler_model.times(self.seed, round_num, len(self.client_ids)), dtype=float
        )
        if times.shape != (len(self.client_ids),):
            raise ValueError(f"straggler model returned times of shape {times.shape}")
        return times

    def _selected(self, round_num: int) -> tuple[np.ndarray, np.ndarray]:
        times = self.compute_times(round_num)
        pool = draw_pool(self.seed, round_num, len(self.client_ids), self.pool)
        order = pool[np.argsort(times[pool], kind="stable")][: self.participants(round_num)]
        return order, times

    def round_wall_clock(self, round_num: int) -> float:
        """max_{i selected} 𝒯_i^t + 𝒞."""
        order, times = self._selected(round_num)
        return float(times[order].max()) + self.communication_cost

    def simulated_time(self, round_num: int) -> float:
        """Σ_{s=1}^{t} round_wall_clock(s) (cached; the same whatever order rounds are asked in)."""
        return self._clock(round_num)

    def sample(self, round_num: int) -> Participation:
        order, times = self._selected(round_num)
        return Participation(
            [self.client_ids[i] for i in order],
            {
                "participants": len(order),
                "pool": self.pool,
                "stage": self.stage(round_num),
                "round_wall_clock": float(times[order].max()) + self.communication_cost,
                "simulated_time": self.simulated_time(round_num),
            },
        )


class FullParticipationClock:
    """All N clients every round, each round waiting for the slowest (FedRep without SRPFL).

    The baseline of srpfl.md §3.1, E[T_FedRep] = T_FR (E[𝒯_(N)] + 𝒞): with the same client ids,
    seed, straggler model and 𝒞 as an `SrpflSampler` it sees the same compute times, so

        round_wall_clock(t) = max_i 𝒯_i^t + 𝒞,
        simulated_time(t)   = Σ_{s=1}^{t} round_wall_clock(s).

    `sample` returns every client (in `client_ids` order, like `FullParticipation`) with `info`
    `participants`, `round_wall_clock`, `simulated_time`. With `pool=N`, FedRep's round is the N
    clients `draw_pool` draws (the same as an `SrpflSampler` with the same seed and pool), and it
    waits for the slowest of them.

    Example:

    >>> clock = FullParticipationClock(["a", "b"], seed=0, communication_cost=1.0)
    >>> clock.sample(1).client_ids
    ['a', 'b']
    """

    def __init__(
        self,
        client_ids: Sequence[str],
        seed: int,
        straggler_model: StragglerModel | None = None,
        communication_cost: float = 0.0,
        pool: int | None = None,
    ):
        self.client_ids = list(client_ids)
        if not self.client_ids:
            raise ValueError("FullParticipationClock needs at least one client id")
        self.pool = check_pool(len(self.client_ids), pool)
        self.seed = seed
        self.straggler_model = straggler_model or FixedExponentialTimes()
        self.communication_cost = _check_communication_cost(communication_cost)
        self._clock = _Clock(self.round_wall_clock)

    def _pool(self, round_num: int) -> np.ndarray:
        return draw_pool(self.seed, round_num, len(self.client_ids), self.pool)

    def round_wall_clock(self, round_num: int) -> float:
        _check_round(round_num)
        times = np.asarray(self.straggler_model.times(self.seed, round_num, len(self.client_ids)))
        return float(np.max(times[self._pool(round_num)])) + self.communication_cost

    def simulated_time(self, round_num: int) -> float:
        return self._clock(round_num)

    def sample(self, round_num: int) -> Participation:
        pool = self._pool(round_num)
        return Participation(
            [self.client_ids[i] for i in pool],
            {
                "participants": len(pool),
                "round_wall_clock": self.round_wall_clock(round_num),
                "simulated_time": self.simulated_time(round_num),
            },
        )
