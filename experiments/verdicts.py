"""Verdicts computed from paired per-seed differences, never typed by hand (issue 51, item 5).

A claim is a paired difference whose paper direction is > 0: with a(m, N, s) the accuracy of
method m at N clients and seed s, its difference at seed s is

    d_s = 100 · Σ_k c_k · a(m_k, N_k, s) − δ    (points; the claim's `terms` are (c_k, m_k, N_k)
                                                 and δ its `margin`, 0 unless a claim is about
                                                 a size, such as a collapse),

over the seeds s finished in every cell it names. Its 95% Student-t interval is

    d̄ ± t_{0.975, n−1} · s_d / √n,   s_d = √(Σ (d_s − d̄)² / (n − 1))   (ddof = 1),

and its verdict is `confirmed` when the interval lies above 0 (the paper's side), `refuted`
when it lies below 0, `not reproduced at this scale` when it contains 0, and
`undecided (n seeds)` with fewer than two paired seeds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from experiments.report import Column, Table
from experiments.running import mean_of, sample_std

LEVEL = 0.95
CONFIRMED = "confirmed"
NOT_REPRODUCED = "not reproduced at this scale"
REFUTED = "refuted"


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


def verdict(interval: Interval) -> str:
    """The word the interval gives a claim whose paper direction is > 0.

    >>> for d in ([2, 3, 4], [1, 2, 3], [-2, -3, -4], [5], [0, 0]):
    ...     print(verdict(t_interval(d)))
    confirmed
    not reproduced at this scale
    refuted
    undecided (1 seed)
    not reproduced at this scale
    """
    if interval.n < 2:
        return f"undecided ({interval.n} seed{'' if interval.n == 1 else 's'})"
    if interval.low > 0:
        return CONFIRMED
    if interval.high < 0:
        return REFUTED
    return NOT_REPRODUCED


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


def claim_rows(claims: Sequence[Claim], rows: Sequence[dict]) -> list[dict]:
    """One row per claim whose cells all ran: its per-seed differences, n, mean, sample std,
    95% t-interval and verdict. `rows` are an experiment's cells: dicts with `key` (method),
    `clients`, `by_seed` ({seed: accuracy}) and `measure`."""
    by_seed = {(r["key"], r["clients"]): r["by_seed"] for r in rows}
    measures = {(r["key"], r["clients"]): r.get("measure") for r in rows}
    out = []
    for claim in claims:
        d = paired_differences(claim, by_seed)
        if d is None:
            continue
        interval = t_interval(list(d.values()))
        measure = sorted({measures[m, n] for _, m, n in claim.terms if measures[m, n]})
        out.append({
            "claim": f"{claim.label} {claim.text}", "difference": claim.difference,
            "measure": ", ".join(measure) or None,
            "per_seed": ", ".join(f"{s}: {v:+.2f}" for s, v in d.items()) or None,
            "seeds": interval.n, "mean": interval.mean, "std": interval.std,
            "ci_low": interval.low, "ci_high": interval.high,
            "paper": claim.paper, "verdict": verdict(interval), "note": _note(claim, interval),
        })
    return out


def claims_table(claims: Sequence[Claim], rows: Sequence[dict], regime: str,
                 notes: Sequence[str] = ()) -> Table | None:
    """The claims table (`claims.csv`, `claims.md`), or None when no claim's cells ran."""
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
               Column("paper (RoBERTa-L)", "paper", paper), Column("verdict", "verdict"),
               Column("note", "note")]
    title = (
        "The paper's claims as paired per-seed differences, each > 0 in the paper's direction "
        "(points of the claim's measure): mean, sample std (ddof = 1) and the 95% Student-t "
        "interval mean ± t(0.975, n − 1)·std/√n over the n seeds finished in every cell the "
        "claim names. Verdict from the interval: confirmed when it lies above 0, refuted when "
        "it lies below 0, not reproduced at this scale when it contains 0, undecided with fewer "
        "than 2 seeds. " + regime)
    return Table(title, columns, out, list(notes))
