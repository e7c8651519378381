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
same clock. The models and the stage arithmetic (`stage_sizes`, `lemma_b1_stage_rounds`,
`expected_order_statistic`) live in `tffl.simulation.srpfl_schedule`; this module is the
samplers. `FullParticipationClock` is the FedRep baseline of the same population: all N take
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

import numpy as np

from tffl.simulation import srpfl_schedule
from tffl.simulation.participation import Participation

# An extra seed-sequence word, so that pool draws are independent of `UniformSampler`'s
# `(seed, round_num)` stream and of the compute times' (`tffl.simulation.srpfl_schedule`).
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
        straggler_model: srpfl_schedule.StragglerModel | None = None,
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
        self.sizes = srpfl_schedule.stage_sizes(num_clients, initial_participants)
        self.initial_participants = initial_participants
        self.seed = seed
        self.straggler_model = straggler_model or srpfl_schedule.FixedExponentialTimes()
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
            return srpfl_schedule.lemma_b1_stage_rounds(self.pool, self.initial_participants,
                                                        lemma_b1_a)
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
        straggler_model: srpfl_schedule.StragglerModel | None = None,
        communication_cost: float = 0.0,
        pool: int | None = None,
    ):
        self.client_ids = list(client_ids)
        if not self.client_ids:
            raise ValueError("FullParticipationClock needs at least one client id")
        self.pool = check_pool(len(self.client_ids), pool)
        self.seed = seed
        self.straggler_model = straggler_model or srpfl_schedule.FixedExponentialTimes()
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
