"""runner/verdicts.py: each verdict word from hand-set intervals, and the paired bootstrap
against closed forms."""

import math

import numpy as np
import pytest

from runner import verdicts
from runner.verdicts import Interval


def _interval(low, high, n=3):
    return Interval(n, (low + high) / 2, 1.0, low, high)


@pytest.mark.parametrize("low, high, paper, word", [
    (0.5, 5.5, 1.8, "reproduced at this scale"),                 # excludes 0, claimed side
    (0.01, 0.2, None, "reproduced at this scale"),
    (-5.5, -0.5, 1.6, "opposite at this scale"),                 # excludes 0, opposite side
    (-3.4, 1.7, 1.93, "smaller than the paper's effect at this scale, at most +1.70 points"),
    (0.0, 0.0, 1.95, "smaller than the paper's effect at this scale, at most +0.00 points"),
    (-2.08, 0.14, 1.41, "smaller than the paper's effect at this scale, at most +0.14 points"),
    (-4.27, 5.08, 1.95, "inconclusive at this scale"),            # holds 0 and the paper's
    (-1.0, 1.95, 1.95, "inconclusive at this scale"),             # the paper's at the edge
    (-1.0, 1.0, None, "inconclusive at this scale"),              # no paper figure
    (-1.0, 1.0, "MNLI +1.41", "inconclusive at this scale"),      # a figure in words
])
def test_each_word_of_the_table(low, high, paper, word):
    assert verdicts.verdict(_interval(low, high), paper) == word


def test_fewer_than_two_seeds_are_undecided():
    assert verdicts.verdict(Interval(1, 2.0, math.nan, math.nan, math.nan), 1.0) == (
        "undecided (1 seed)")
    assert verdicts.verdict(Interval(0, math.nan, math.nan, math.nan, math.nan)) == (
        "undecided (0 seeds)")


def test_a_claim_weighs_its_stated_effect_over_a_paper_figure_in_words():
    claim = verdicts.Claim("(f)", "", "", (), "MNLI +1.41, QQP +1.56", effect=1.41)
    assert claim.paper_effect == 1.41
    assert verdicts.Claim("(b)", "", "", (), 1.8).paper_effect == 1.8
    assert verdicts.Claim("(x)", "", "", (), "words").paper_effect is None


def test_the_bootstrap_of_constant_differences_is_that_constant():
    per_seed = {s: np.full(50, 7.5) for s in range(3)}
    assert verdicts.paired_bootstrap(per_seed, replicates=200) == (7.5, 7.5)


def test_one_seeds_bootstrap_is_the_binomial_proportions():
    """One seed: only the examples are drawn again, so the replicates are a proportion's
    bootstrap: D = 100·p̂ with p̂ = 0.3 on J = 2000 examples, standard error
    100·√(p̂(1 − p̂)/J) = 1.0247, a 95% interval of half-width 1.96·1.0247 = 2.008."""
    y = np.zeros(2000)
    y[:600] = 100.0
    low, high = verdicts.paired_bootstrap({0: y}, replicates=20_000, seed=1)
    half = 1.959964 * 100 * math.sqrt(0.3 * 0.7 / 2000)
    assert low == pytest.approx(30.0 - half, abs=0.15) and high == pytest.approx(
        30.0 + half, abs=0.15)


def test_seeds_that_differ_widen_the_interval_by_their_spread():
    """Examples that do not vary within a seed: the replicates are means of n seeds drawn with
    replacement from their values (0, 10): D* = 10·k/2 with k ~ Binomial(2, ½), so the 2.5% and
    97.5% quantiles are 0 and 10, and the centre of mass is 5."""
    per_seed = {0: np.zeros(40), 1: np.full(40, 10.0)}
    assert verdicts.paired_bootstrap(per_seed, replicates=4000) == (0.0, 10.0)
