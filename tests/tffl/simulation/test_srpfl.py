"""tffl.simulation.srpfl: SRPFL's fastest-n participation, doubling schedule and simulated wall-clock.

Checked against independent numpy (argsort, cumsum) and closed forms from shared/specs/srpfl.md,
never against the module's own output.
"""

import math

import numpy as np
import pytest

from tffl.simulation import srpfl, srpfl_schedule

IDS = [f"c{i}" for i in range(20)]


def _harmonic_tail(num_clients, n):
    """Σ_{j=N−n+1}^{N} 1/j, written out independently of the module."""
    return float(np.sum(1.0 / np.arange(num_clients - n + 1, num_clients + 1)))


@pytest.mark.parametrize(
    "model",
    [srpfl_schedule.FixedExponentialTimes(rate=2.0), srpfl_schedule.DynamicExponentialTimes()],
    ids=["fixed", "dynamic"],
)
def test_selection_is_the_n_fastest_and_n_doubles_per_stage(model):
    sampler = srpfl.SrpflSampler(IDS, initial_participants=3, seed=7, straggler_model=model,
                                 stage_rounds=4, communication_cost=0.25)
    # n: 3, 6, 12, 20 (capped) for 4 rounds each, then 20 forever.
    expected_n = [3] * 4 + [6] * 4 + [12] * 4 + [20] * 6
    for t, n in enumerate(expected_n, start=1):
        times = sampler.compute_times(t)
        part = sampler.sample(t)
        fastest = [IDS[i] for i in np.argsort(times)[:n]]
        assert part.client_ids == fastest
        assert part.info["participants"] == n
        assert part.info["stage"] == min((t - 1) // 4, 3)
        assert part.info["round_wall_clock"] == pytest.approx(np.sort(times)[n - 1] + 0.25)


def test_fixed_times_are_fixed_and_dynamic_times_change():
    fixed = srpfl.SrpflSampler(IDS, 2, seed=1,
                               straggler_model=srpfl_schedule.FixedExponentialTimes())
    np.testing.assert_array_equal(fixed.compute_times(1), fixed.compute_times(9))
    dynamic = srpfl.SrpflSampler(IDS, 2, seed=1,
                                 straggler_model=srpfl_schedule.DynamicExponentialTimes())
    assert not np.array_equal(dynamic.compute_times(1), dynamic.compute_times(2))


def test_dynamic_rates_are_uniform_on_one_over_n_to_one_and_times_have_mean_one_over_rate():
    """λ_i ~ U[1/N, 1] (srpfl.md §3.2); 𝒯_i^t ~ Exp(λ_i): mean 1/λ_i, std 1/λ_i."""
    model = srpfl_schedule.DynamicExponentialTimes()
    rates = model.rates(seed=3, num_clients=20)
    assert np.all((rates >= 1 / 20) & (rates <= 1))
    rounds = 2000
    times = np.stack([model.times(3, t, 20) for t in range(1, rounds + 1)])
    stderr = (1 / rates) / math.sqrt(rounds)
    assert np.all(np.abs(times.mean(axis=0) - 1 / rates) < 5 * stderr)


def test_doubling_schedule_from_n0_capped_at_n():
    sampler = srpfl.SrpflSampler([str(i) for i in range(100)], 10, seed=0, stage_rounds=10)
    for t in range(1, 151):
        r = (t - 1) // 10
        assert sampler.participants(t) == min(100, 10 * 2**r)  # srpfl.md §2.4: 10,20,40,80,100
    assert srpfl_schedule.stage_sizes(100, 10) == [10, 20, 40, 80, 100]
    assert srpfl_schedule.stage_sizes(5, 5) == [5]


def test_per_stage_sequence_of_lengths():
    sampler = srpfl.SrpflSampler(IDS[:8], 2, seed=0, stage_rounds=[1, 2])
    assert [sampler.participants(t) for t in range(1, 7)] == [2, 4, 4, 8, 8, 8]
    assert [sampler.stage(t) for t in range(1, 7)] == [0, 1, 1, 2, 2, 2]


def test_cumulative_time_is_numpy_cumsum_of_max_selected_plus_comm_cost():
    cost = 1.5
    sampler = srpfl.SrpflSampler(IDS, 2, seed=11,
                                 straggler_model=srpfl_schedule.DynamicExponentialTimes(),
                                 stage_rounds=3, communication_cost=cost)
    rounds = 16
    per_round = []
    for t in range(1, rounds + 1):
        n = min(20, 2 * 2 ** ((t - 1) // 3))
        per_round.append(np.sort(sampler.compute_times(t))[:n].max() + cost)
    cumulative = np.cumsum(per_round)
    got = [sampler.sample(t).info["simulated_time"] for t in range(1, rounds + 1)]
    np.testing.assert_allclose(got, cumulative, rtol=1e-12)


def test_full_participation_clock_waits_for_the_slowest():
    model = srpfl_schedule.DynamicExponentialTimes()
    clock = srpfl.FullParticipationClock(IDS, seed=4, straggler_model=model, communication_cost=2)
    srp = srpfl.SrpflSampler(IDS, 1, seed=4, straggler_model=model, communication_cost=2)
    per_round = [srp.compute_times(t).max() + 2 for t in range(1, 11)]
    for t in range(1, 11):
        part = clock.sample(t)
        assert part.client_ids == IDS
        assert part.info["round_wall_clock"] == pytest.approx(per_round[t - 1])
        assert part.info["simulated_time"] == pytest.approx(np.cumsum(per_round)[t - 1])
    # SRPFL's early rounds are never slower than waiting for everyone.
    assert srp.simulated_time(10) <= clock.simulated_time(10)


@pytest.mark.parametrize(
    "model",
    [srpfl_schedule.FixedExponentialTimes(), srpfl_schedule.DynamicExponentialTimes()],
    ids=["fixed", "dynamic"],
)
def test_deterministic_in_seed_and_round_even_out_of_order(model):
    def make(seed):
        return srpfl.SrpflSampler(IDS, 2, seed=seed, straggler_model=model, stage_rounds=2,
                                  communication_cost=0.5)

    forward = make(5)
    in_order = [forward.sample(t) for t in range(1, 13)]
    scrambled = make(5)
    rounds = [9, 2, 12, 1, 5, 11, 3, 10, 4, 8, 6, 7]
    out_of_order = {t: scrambled.sample(t) for t in rounds}
    for t in range(1, 13):
        assert out_of_order[t] == in_order[t - 1]
    assert not np.array_equal(make(6).compute_times(1), forward.compute_times(1))


def test_exponential_order_statistic_closed_form():
    """Mean over seeds of 𝒯_(n) of N Exp(λ) = (1/λ) Σ_{j=N−n+1}^{N} 1/j (srpfl.md §4.7).

    Var[𝒯_(n)] = (1/λ²) Σ_{j=N−n+1}^{N} 1/j² (Rényi), which gives the standard error.
    """
    num_clients, n, rate, seeds = 20, 8, 2.0, 3000
    ids = [str(i) for i in range(num_clients)]
    model = srpfl_schedule.FixedExponentialTimes(rate=rate)
    values = [
        srpfl.SrpflSampler(ids, n, seed=s, straggler_model=model).sample(1).info["round_wall_clock"]
        for s in range(seeds)
    ]
    mean = _harmonic_tail(num_clients, n) / rate
    var = float(np.sum(1.0 / np.arange(num_clients - n + 1, num_clients + 1) ** 2)) / rate**2
    assert abs(np.mean(values) - mean) < 4 * math.sqrt(var / seeds)
    assert srpfl_schedule.expected_order_statistic(n, num_clients, rate) == pytest.approx(mean)
    # srpfl.md §4.7 table for Exp(1), N = 100.
    table = {10: 0.105, 20: 0.222, 40: 0.508, 80: 1.590, 100: 5.187}
    for k, v in table.items():
        assert srpfl_schedule.expected_order_statistic(k, 100) == pytest.approx(v, abs=6e-4)


def _lemma_b1_independent(num_clients, n0, a):
    sizes = [n0]
    while sizes[-1] < num_clients:
        sizes.append(min(num_clients, 2 * sizes[-1]))
    e = [_harmonic_tail(num_clients, n) for n in sizes]
    out = []
    for r in range(len(sizes) - 1):
        ratio = 3.0 if r == 0 else (e[r + 1] - e[r]) / (e[r] - e[r - 1])
        out.append(max(1, math.ceil(2 * math.log(math.sqrt(2) * ratio) / -math.log(1 - a))))
    return out


@pytest.mark.parametrize("num_clients,n0,a", [(100, 10, 0.25), (1000, 10, 0.25), (64, 4, 0.1)])
def test_lemma_b1_stage_lengths(num_clients, n0, a):
    expected = _lemma_b1_independent(num_clients, n0, a)
    assert srpfl_schedule.lemma_b1_stage_rounds(num_clients, n0, a) == expected
    sampler = srpfl.SrpflSampler([str(i) for i in range(num_clients)], n0, seed=0,
                                 stage_rounds="lemma_b1", lemma_b1_a=a)
    ends = np.cumsum(expected)
    for r, end in enumerate(ends):
        assert sampler.stage(int(end)) == r and sampler.stage(int(end) + 1) == r + 1
        assert sampler.participants(int(end) + 1) == min(num_clients, n0 * 2 ** (r + 1))


def test_lemma_b1_early_stage_matches_spec_value():
    """srpfl.md §4.5: with a = 1/4, early stages need 2 ln(3√2)/ln(4/3) ≈ 10.0 rounds."""
    assert srpfl_schedule.lemma_b1_stage_rounds(100, 10, 0.25)[0] == math.ceil(10.047)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"initial_participants": 21}, "initial_participants=21"),
        ({"initial_participants": 0}, "initial_participants=0"),
        ({"stage_rounds": 0}, "stage_rounds=0"),
        ({"stage_rounds": -3}, "stage_rounds=-3"),
        ({"stage_rounds": [2, 0, 1, 1, 1]}, r"stage_rounds=\[2, 0"),
        ({"stage_rounds": [2]}, r"stage_rounds=\[2\]"),
        ({"stage_rounds": "doubling"}, "stage_rounds='doubling'"),
        ({"communication_cost": -1.0}, "communication_cost=-1.0"),
        ({"stage_rounds": "lemma_b1", "lemma_b1_a": 1.5}, "a=1.5"),
    ],
)
def test_bad_sampler_arguments(kwargs, match):
    args = {"client_ids": IDS, "initial_participants": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        srpfl.SrpflSampler(**args)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
def test_bad_rates(rate):
    with pytest.raises(ValueError, match="rate="):
        srpfl_schedule.FixedExponentialTimes(rate=rate)
    with pytest.raises(ValueError, match="rate_high="):
        srpfl_schedule.DynamicExponentialTimes(rate_high=rate)
    with pytest.raises(ValueError, match="rate_low="):
        srpfl_schedule.DynamicExponentialTimes(rate_low=rate)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="stage_rounds=0"):
        srpfl.SrpflSampler(IDS[:2], 2, seed=0, stage_rounds=0)  # one stage only: still checked
    with pytest.raises(ValueError, match="initial_participants=2.5"):
        srpfl.SrpflSampler(IDS, 2.5, seed=0)
    with pytest.raises(ValueError, match="rate_low=2.0"):
        srpfl_schedule.DynamicExponentialTimes(rate_low=2.0, rate_high=1.0)
    with pytest.raises(ValueError, match="communication_cost=-0.5"):
        srpfl.FullParticipationClock(IDS, seed=0, communication_cost=-0.5)
    with pytest.raises(ValueError, match="round_num=0"):
        srpfl.SrpflSampler(IDS, 2, seed=0).sample(0)
    with pytest.raises(ValueError, match="distinct"):
        srpfl.SrpflSampler(["a", "a"], 1, seed=0)


def test_expected_wall_clock_matches_section_3_1():
    """i.i.d. Exp(λ) times per round (srpfl.md §3.1): E[T_SRPFL] = Σ_r τ_r (E[𝒯_(n_r)] + 𝒞) and
    E[T_FedRep] = T (E[𝒯_(N)] + 𝒞), with E[𝒯_(n)] = (1/λ) Σ_{j=N−n+1}^{N} 1/j."""
    num_clients, n0, tau, rate, cost, seeds = 16, 2, 2, 0.5, 0.3, 600
    ids = [str(i) for i in range(num_clients)]
    model = srpfl_schedule.DynamicExponentialTimes(rate_low=rate, rate_high=rate)
    sizes = [2, 2, 4, 4, 8, 8, 16, 16]  # τ = 2 rounds per stage, 8 rounds
    mean = sum(_harmonic_tail(num_clients, n) / rate + cost for n in sizes)
    var = sum(float(np.sum(1.0 / np.arange(num_clients - n + 1, num_clients + 1) ** 2)) / rate**2
              for n in sizes)
    full_mean = len(sizes) * (_harmonic_tail(num_clients, num_clients) / rate + cost)
    full_var = len(sizes) * float(np.sum(1.0 / np.arange(1, num_clients + 1) ** 2)) / rate**2
    srp, full = [], []
    for s in range(seeds):
        srp.append(srpfl.SrpflSampler(ids, n0, seed=s, straggler_model=model, stage_rounds=tau,
                                      communication_cost=cost).simulated_time(len(sizes)))
        full.append(srpfl.FullParticipationClock(ids, seed=s, straggler_model=model,
                                                 communication_cost=cost).simulated_time(8))
    assert abs(np.mean(srp) - mean) < 4 * math.sqrt(var / seeds)
    assert abs(np.mean(full) - full_mean) < 4 * math.sqrt(full_var / seeds)


# --- Partial participation: N of M drawn each round, then the fastest n of those N ------------


def test_pool_is_n_distinct_clients_redrawn_each_round_uniformly():
    m, n, rounds = 50, 10, 3000
    pools = [srpfl.draw_pool(3, t, m, n) for t in range(1, rounds + 1)]
    assert all(len(set(p.tolist())) == n and p.min() >= 0 and p.max() < m for p in pools)
    assert len({tuple(p.tolist()) for p in pools[:20]}) == 20  # redrawn every round
    np.testing.assert_array_equal(srpfl.draw_pool(3, 7, m, n), pools[6])  # pure in (seed, t)
    # Uniform without replacement: each client is in a round's pool with probability N/M.
    counts = np.bincount(np.concatenate(pools), minlength=m)
    p = n / m
    sigma = math.sqrt(rounds * p * (1 - p))
    assert np.all(np.abs(counts - rounds * p) < 5 * sigma)
    np.testing.assert_array_equal(srpfl.draw_pool(0, 1, 6, None), np.arange(6))


def test_srpfl_with_a_pool_takes_the_fastest_of_the_pool_and_stages_end_at_n():
    m, pool = 20, 8
    model = srpfl_schedule.FixedExponentialTimes()
    sampler = srpfl.SrpflSampler(IDS, initial_participants=2, seed=5, straggler_model=model,
                                 stage_rounds=3, communication_cost=0.5, pool=pool)
    expected_n = [2] * 3 + [4] * 3 + [8] * 6  # n0 = 2 doubling to N = 8, not to M = 20
    clock = 0.0
    for t, n in enumerate(expected_n, start=1):
        drawn = srpfl.draw_pool(5, t, m, pool)
        times = model.times(5, t, m)
        part = sampler.sample(t)
        chosen = [IDS.index(c) for c in part.client_ids]
        assert len(chosen) == n and set(chosen) <= set(drawn.tolist())
        rest = sorted(set(drawn.tolist()) - set(chosen))
        if rest:  # every pooled client left out is slower than every chosen one
            assert times[chosen].max() <= times[rest].min()
        assert part.info["pool"] == pool
        assert part.info["round_wall_clock"] == pytest.approx(times[chosen].max() + 0.5)
        clock += times[chosen].max() + 0.5
        assert part.info["simulated_time"] == pytest.approx(clock)


def test_fedrep_clock_with_the_same_pool_runs_the_drawn_clients_and_waits_for_their_slowest():
    model = srpfl_schedule.FixedExponentialTimes()
    fedrep = srpfl.FullParticipationClock(IDS, seed=2, straggler_model=model, pool=5,
                                          communication_cost=1.0)
    for t in (1, 2, 9):
        drawn = srpfl.draw_pool(2, t, len(IDS), 5)
        part = fedrep.sample(t)
        assert sorted(part.client_ids) == sorted(IDS[i] for i in drawn)
        assert part.info["round_wall_clock"] == pytest.approx(
            model.times(2, t, len(IDS))[drawn].max() + 1.0)


def test_bad_pools_are_one_line_errors():
    with pytest.raises(ValueError, match="pool=21 exceeds the population of 20 clients"):
        srpfl.SrpflSampler(IDS, initial_participants=2, seed=0, pool=21)
    with pytest.raises(ValueError, match="pool=0 must be an int >= 1"):
        srpfl.FullParticipationClock(IDS, seed=0, pool=0)
    with pytest.raises(ValueError, match="initial_participants=6 exceeds the number of clients N=5"):
        srpfl.SrpflSampler(IDS, initial_participants=6, seed=0, pool=5)
