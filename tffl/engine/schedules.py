"""Schedules of round kinds: `t ↦ round kind` (t = communication rounds done), in Python.

A periodic schedule has a `cycle`, the kinds of one period, which a process's `next` runs as one
federated computation (`tffl.engine.composition.compose_cycle`; RoLoRA's: the B round then the A
round, each on its own clients' data, named by `cycle_data_names`).

>>> schedule = alternating("b_round", "a_round")
>>> [schedule(t) for t in range(4)], cycle_of(schedule)
(['b_round', 'a_round', 'b_round', 'a_round'], ('b_round', 'a_round'))
>>> cycle_of(alternating("b_round", "a_round", switch=3, after="b_round")) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def alternating(first: str, second: str, switch: int | None = None,
                after: str | None = None) -> Callable[[int], str]:
    """t ↦ `first` for even t, `second` for odd t; from t = `switch` on, `after`. Without a
    switch the schedule is periodic: its `cycle` is `(first, second)`."""

    def schedule(t: int) -> str:
        if switch is not None and t >= switch:
            return after
        return first if t % 2 == 0 else second

    schedule.cycle = (first, second) if switch is None else None
    return schedule


def constant(name: str) -> Callable[[int], str]:
    def schedule(t: int) -> str:
        del t
        return name

    schedule.cycle = (name,)
    return schedule


def cyclic(kinds: Sequence[str]) -> Callable[[int], str]:
    """t ↦ `kinds[t mod E]`, E = len(kinds): the periodic schedule whose `cycle` is `kinds`.

    >>> schedule = cyclic(["b_round", "b_round", "a_round"])
    >>> [schedule(t) for t in range(4)], cycle_of(schedule)
    (['b_round', 'b_round', 'a_round', 'b_round'], ('b_round', 'b_round', 'a_round'))
    """
    kinds = tuple(kinds)
    if not kinds:
        raise ValueError("a cyclic schedule needs at least one round kind")

    def schedule(t: int) -> str:
        return kinds[t % len(kinds)]

    schedule.cycle = kinds
    return schedule


def cycle_of(schedule: Callable[[int], str]) -> tuple[str, ...] | None:
    """The round kinds of one period of `schedule` (None if it is not periodic)."""
    return getattr(schedule, "cycle", None)


def cycle_data_names(kinds: Sequence[str]) -> list[str]:
    """The names of a cycle's per-exchange client data: the round kinds (if distinct).

    >>> cycle_data_names(("b_round", "a_round")), cycle_data_names(("b_round", "b_round"))
    (['b_round', 'a_round'], ['round_0', 'round_1'])
    """
    return list(kinds) if len(set(kinds)) == len(kinds) else [
        f"round_{i}" for i in range(len(kinds))]
