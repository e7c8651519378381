"""Parametrized cases split over the two tiers: the fast tier runs a covering subset (every value
of every parameter at least once), the large tier (`pytest -m large`, and `.ci/run`) the rest.

>>> [p.id for p in tiered([("bert", "mean"), ("roberta", "cls")], fast=[("bert", "mean")])]
['bert-mean', 'roberta-cls']
>>> [[m.name for m in p.marks] for p in tiered(["rolora", "flora"], fast=["flora"])]
[['large'], []]
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def tiered(cases: Iterable, fast: Iterable) -> list:
    """`pytest.param`s of `cases` (values, or tuples of one test's arguments), each not in `fast`
    marked `large`; ids join the values with '-'."""
    cases, fast = list(cases), list(fast)
    unknown = [c for c in fast if c not in cases]
    if unknown:
        raise ValueError(f"fast cases {unknown} are not among the cases")
    params = []
    for case in cases:
        values = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param(*values, id="-".join(map(str, values)),
                                   marks=() if case in fast else pytest.mark.large))
    return params
