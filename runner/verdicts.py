"""Verdicts computed from paired per-seed differences, never typed by hand.

A claim is a paired difference whose paper direction is > 0: with a(m, N, s) the accuracy of
method m at N clients and seed s, its difference at seed s is

    d_s = 100 · Σ_k c_k · a(m_k, N_k, s) − δ    (points; the claim's `terms` are (c_k, m_k, N_k)
                                                 and δ its `margin`, 0 unless a claim is about
                                                 a size, such as a collapse),

over the seeds s finished in every cell it names. Its 95% Student-t interval is

    d̄ ± t_{0.975, n−1} · s_d / √n,   s_d = √(Σ (d_s − d̄)² / (n − 1))   (ddof = 1),

and its verdict word comes from where the interval [lo, hi] lies against 0 and the paper's own
difference p (`verdict`), each said "at this scale" (the regime beside it says which):

| the interval | word |
| --- | --- |
| lo > 0: excludes 0 in the claimed direction | reproduced |
| hi < 0: excludes 0 in the opposite direction | opposite |
| lo ≤ 0 ≤ hi < p: holds 0, lies below the paper's effect | smaller than the paper's effect, at most hi |
| lo ≤ 0 ≤ hi, p ≤ hi (or no p): holds 0 and the paper's effect | inconclusive |

and `undecided (n seeds)` with fewer than two paired seeds. Where every run of the claim's cells
kept its per-example predictions (`tffl.simulation.predictions`), `paired_bootstrap` gives a
second interval, resampling seeds and examples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runner.report import Column, Table
from runner.running import mean_of, sample_std

LEVEL = 0.95
SCALE = "at this scale"
REPRODUCED = "reproduced"
OPPOSITE = "opposite"
SMALLER = "smaller than the paper's effect"
INCONCLUSIVE = "inconclusive"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A paired difference's n, mean, sample std (ddof = 1) and two-sided t-interval."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """x̄ ± t_{(1+level)/2, n−1} · s / √n, s the ddof = 1 std; low = high = NaN for n < 2.

    >>> i = t_interval([1.0, 2.0, 3.0])     # s = 1, t(0.975, 2) = 4.302653: ± 4.302653/√3
    >>> i.n, i.mean, i.std, round(i.low, 4), round(i.high, 4)
    (3, 2.0, 1.0, -0.4841, 4.4841)
    >>> t_interval([4.0]).low
    nan
    """
    from scipy import stats

    n = len(values)
    mean = mean_of(values) if n else math.nan
    std = sample_std(values)
    if n < 2:
        return Interval(n, mean, std, math.nan, math.nan)
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * std / math.sqrt(n)
    return Interval(n, mean, std, mean - half, mean + half)


def verdict(interval: Interval, paper: float | str | None = None) -> str:
    """The word the interval gives a claim whose paper direction is > 0, beside the paper's own
    difference `paper` (points; text or None: unknown). The module docstring's table:

    >>> for d, p in (([2, 3, 4], 1.8), ([-2, -3, -4], 1.5), ([-1, 0, 1], 3.0), ([-1, 0, 1], 1.9),
    ...              ([-1, 0, 1], None), ([5], 2.0)):
    ...     print(verdict(t_interval(d), p))
    reproduced at this scale
    opposite at this scale
    smaller than the paper's effect at this scale, at most +2.48 points
    inconclusive at this scale
    inconclusive at this scale
    undecided (1 seed)
    """
    if interval.n < 2:
        return f"undecided ({interval.n} seed{'' if interval.n == 1 else 's'})"
    if interval.low > 0:
        return f"{REPRODUCED} {SCALE}"
    if interval.high < 0:
        return f"{OPPOSITE} {SCALE}"
    if isinstance(paper, (int, float)) and interval.high < paper:
        return f"{SMALLER} {SCALE}, at most {interval.high:+.2f} points"
    return f"{INCONCLUSIVE} {SCALE}"


@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper's claim as the paired difference Σ c·a(method, N) (direction > 0).

    `label` names it ("(a)"), `text` says it in words, `difference` writes the formula,
    `terms` are its (c, method key, N), `paper` is the paper's figure of the same difference
    (points; a number, text or None, the margin taken off like the difference's) and `note` (optional) follows the
    verdict. A claim about a size (a collapse) has a `margin` δ > 0: its difference is the
    accuracy gap less δ, so that it is confirmed only when the gap's interval lies above δ."""

    label: str
    text: str
    difference: str
    terms: tuple[tuple[float, str, int], ...]
    paper: float | str | None = None
    note: str = ""
    margin: float = 0.0
    # The paper's effect the verdict weighs the interval against (points): `paper` when it is
    # a number; for a claim whose paper figure is of other data, the figure stated here.
    effect: float | None = None

    @property
    def paper_effect(self) -> float | None:
        """`effect`, else `paper` when it is a number, else None."""
        if self.effect is not None:
            return self.effect
        return self.paper if isinstance(self.paper, (int, float)) else None


def _note(claim: Claim, interval: Interval) -> str | None:
    """The claim's note; with a margin δ, the gap itself beside the paper's.

    >>> claim = Claim("(d)", "", "", (), 28.92, margin=10.0)
    >>> print(_note(claim, t_interval([1.0 - 10, 1.5 - 10])))
    the gap less 10 points: the gap is +1.25 points (paper +38.92)
    """
    notes = [claim.note] if claim.note else []
    if claim.margin and interval.n:
        paper = (f" (paper {claim.paper + claim.margin:+.2f})"
                 if isinstance(claim.paper, (int, float)) else "")
        notes.append(f"the gap less {claim.margin:g} points: the gap is "
                     f"{interval.mean + claim.margin:+.2f} points{paper}")
    return "; ".join(notes) or None


def paired_differences(claim: Claim, by_seed: Mapping[tuple[str, int], Mapping[int, float]]
                       ) -> dict[int, float] | None:
    """{seed: d_s} over the seeds finished in every cell of the claim (d_s in points, see the
    module docstring); None when a cell the claim names has no row (its method did not run).

    >>> cells = {("x", 3): {0: 0.85, 1: 0.84}, ("x", 50): {0: 0.82, 2: 0.8}}
    >>> d = paired_differences(Claim("(c)", "", "", ((1, "x", 3), (-1, "x", 50))), cells)
    >>> {s: round(v, 6) for s, v in d.items()}
    {0: 3.0}
    """
    if any((method, n) not in by_seed for _, method, n in claim.terms):
        return None
    seeds = set.intersection(*(set(s for s, a in by_seed[m, n].items() if a is not None)
                               for _, m, n in claim.terms))
    return {s: 100 * sum(c * by_seed[m, n][s] for c, m, n in claim.terms) - claim.margin
            for s in sorted(seeds)}


def paired_bootstrap(per_seed: Mapping[int, np.ndarray], replicates: int = 2000,
                     level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """The `level` percentile interval of a paired bootstrap over seeds and examples.

    `per_seed[s]` is the claim's difference of seed s on each of the J examples all its runs
    evaluated, y_{s,j} = 100 · Σ_k c_k · [run k of seed s is right on example j] − δ, so that
    the claim's difference is D = mean_s mean_j y_{s,j}. A replicate draws n seeds and J
    examples with replacement (the same examples for every seed: the runs are paired by
    example too) and takes D on them.

    >>> y = {0: np.array([100.0, 0.0, 0.0, 0.0]), 1: np.array([100.0, 100.0, 0.0, 0.0])}
    >>> low, high = paired_bootstrap(y, replicates=4000)
    >>> bool(low < 37.5 < high), round(low, 1) >= 0.0, round(high, 1) <= 100.0
    (True, True, True)
    """
    seeds = sorted(per_seed)
    values = np.stack([np.asarray(per_seed[s], np.float64) for s in seeds])   # (n, J)
    n, examples = values.shape
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(examples, np.full(examples, 1.0 / examples), size=replicates)
    per_seed_means = values @ counts.T / examples                              # (n, B)
    drawn = rng.integers(0, n, size=(replicates, n))
    replicated = per_seed_means[drawn, np.arange(replicates)[:, None]].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(replicated, [tail, 1 - tail])
    return float(low), float(high)


def _example_differences(claim: Claim, correct: Mapping[tuple[str, int], Mapping[int, Any]],
                         seeds) -> dict[int, np.ndarray] | None:
    """{seed: y_s} (`paired_bootstrap`) from the cells' per-example correctness, None unless
    every cell of the claim has it for every seed, on examples of one length."""
    try:
        rows = {s: [correct[m, n][s] for _, m, n in claim.terms] for s in seeds}
    except KeyError:
        return None
    if not rows or any(r is None for rs in rows.values() for r in rs):
        return None
    if len({len(r) for rs in rows.values() for r in rs}) != 1:
        return None
    return {s: 100 * sum(c * np.asarray(r, np.float64) for (c, _, _), r in zip(claim.terms, rs))
            - claim.margin for s, rs in rows.items()}


def claim_rows(claims: Sequence[Claim], rows: Sequence[dict]) -> list[dict]:
    """One row per claim whose cells all ran: its per-seed differences, n, mean, sample std,
    95% t-interval and verdict on the claim's measure (`by_seed`), the same on the dev split
    (`by_seed_dev`, where the rows have it: `dev_*`), and the paired bootstrap's interval
    (`boot_low`, `boot_high`) where every run kept its predictions (`correct_by_seed`: {seed:
    per-example correctness on the measure's split}). `rows` are an experiment's cells: dicts
    with `key` (method), `clients`, `by_seed` ({seed: accuracy}) and `measure`."""
    by_seed = {(r["key"], r["clients"]): r["by_seed"] for r in rows}
    by_seed_dev = {(r["key"], r["clients"]): r.get("by_seed_dev", {}) for r in rows}
    correct = {(r["key"], r["clients"]): r.get("correct_by_seed", {}) for r in rows}
    measures = {(r["key"], r["clients"]): r.get("measure") for r in rows}
    out = []
    for claim in claims:
        d = paired_differences(claim, by_seed)
        if d is None:
            continue
        interval = t_interval(list(d.values()))
        measure = sorted({measures[m, n] for _, m, n in claim.terms if measures[m, n]})
        dev = paired_differences(claim, by_seed_dev)
        dev_interval = t_interval(list(dev.values())) if dev else None
        examples = _example_differences(claim, correct, list(d))
        boot = (paired_bootstrap(examples) if examples is not None and len(examples) >= 2
                else (None, None))
        out.append({
            "claim": f"{claim.label} {claim.text}", "difference": claim.difference,
            "measure": ", ".join(measure) or None,
            "per_seed": ", ".join(f"{s}: {v:+.2f}" for s, v in d.items()) or None,
            "seeds": interval.n, "mean": interval.mean, "std": interval.std,
            "ci_low": interval.low, "ci_high": interval.high,
            "boot_low": boot[0], "boot_high": boot[1],
            "dev_mean": dev_interval.mean if dev_interval else None,
            "dev_ci_low": dev_interval.low if dev_interval else None,
            "dev_ci_high": dev_interval.high if dev_interval else None,
            "dev_verdict": verdict(dev_interval, claim.paper_effect) if dev_interval else None,
            "paper": claim.paper, "verdict": verdict(interval, claim.paper_effect),
            "note": _note(claim, interval),
        })
    return out


def claims_table(claims: Sequence[Claim], rows: Sequence[dict], regime: str,
                 notes: Sequence[str] = (), heading: str = "") -> Table | None:
    """The claims table (`claims.csv`, `claims.md`), or None when no claim's cells ran; its
    title opens with `heading` (what sets this table apart, when there are two)."""
    out = claim_rows(claims, rows)
    if not out:
        return None
    paper = lambda v: f"{v:+.2f}" if isinstance(v, (int, float)) else str(v)  # noqa: E731
    columns = [Column("claim (paper: difference > 0)", "claim"),
               Column("paired difference (points)", "difference"),
               Column("measure", "measure"),
               Column("per seed (seed: points)", "per_seed"), Column("n", "seeds"),
               Column("mean", "mean", "{:+.2f}"), Column("std (ddof = 1)", "std", "{:.2f}"),
               Column("95% t low", "ci_low", "{:+.2f}"),
               Column("95% t high", "ci_high", "{:+.2f}"),
               Column("95% bootstrap low", "boot_low", "{:+.2f}"),
               Column("95% bootstrap high", "boot_high", "{:+.2f}"),
               Column("dev mean", "dev_mean", "{:+.2f}"),
               Column("dev 95% t low", "dev_ci_low", "{:+.2f}"),
               Column("dev 95% t high", "dev_ci_high", "{:+.2f}"),
               Column("paper (RoBERTa-L)", "paper", paper), Column("verdict", "verdict"),
               Column("verdict on dev", "dev_verdict"),
               Column("note", "note")]
    title = heading + (
        "The paper's claims as paired per-seed differences, each > 0 in the paper's direction "
        "(points of the claim's measure): mean, sample std (ddof = 1) and the 95% Student-t "
        "interval mean ± t(0.975, n − 1)·std/√n over the n seeds finished in every cell the "
        "claim names, on the claim's measure and, beside it, on the dev split; where every "
        "run kept its per-example predictions, a 95% paired bootstrap interval over seeds and "
        "sentences. Verdict from the interval and the paper's difference p: reproduced when it "
        "lies above 0, opposite when below 0, smaller than the paper's effect (at most its "
        "upper end) when it holds 0 and lies below p, inconclusive when it holds 0 and p, "
        "each at this scale; undecided with fewer than 2 seeds. " + regime)
    columns = [c for c in columns if any(r.get(c.key) is not None for r in out)]
    return Table(title, columns, out, list(notes))
