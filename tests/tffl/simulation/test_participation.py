"""tffl.simulation.participation: seeded, per-round-independent client sampling."""

import collections

import pytest

from tffl.simulation import participation


def test_uniform_sampler_is_a_pure_function_of_seed_and_round():
    ids = [f"c{i}" for i in range(50)]
    a = participation.UniformSampler(ids, 10, seed=3)
    b = participation.UniformSampler(ids, 10, seed=3)
    assert [a.sample(t).client_ids for t in (5, 1, 9)] == [b.sample(t).client_ids for t in (5, 1, 9)]
    assert a.sample(1).client_ids != participation.UniformSampler(ids, 10, seed=4).sample(1).client_ids
    for t in range(1, 20):
        chosen = a.sample(t).client_ids
        assert len(chosen) == 10 and len(set(chosen)) == 10 and set(chosen) <= set(ids)


def test_uniform_sampler_frequencies_are_uniform():
    """Over R rounds each of N clients is picked Binomial(R, m/N) times: mean R·m/N."""
    ids = [str(i) for i in range(20)]
    sampler = participation.UniformSampler(ids, 5, seed=0)
    rounds = 2000
    counts = collections.Counter(c for t in range(rounds) for c in sampler.sample(t).client_ids)
    expected = rounds * 5 / 20
    std = (rounds * 0.25 * 0.75) ** 0.5
    assert all(abs(counts[c] - expected) < 5 * std for c in ids)


@pytest.mark.parametrize("per_round", [0, 4])
def test_bad_clients_per_round(per_round):
    with pytest.raises(ValueError, match=f"clients_per_round={per_round}"):
        participation.UniformSampler(["a", "b", "c"], per_round, seed=0)


def test_full_participation():
    assert participation.FullParticipation(["a", "b"]).sample(7).client_ids == ["a", "b"]
