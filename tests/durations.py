"""The order in which pytest-xdist hands out test files: longest first, from measured seconds.

With `--dist=loadfile --no-loadscope-reorder` (pyproject.toml) each file runs whole on one
worker, in collection order. If a long file comes last, one worker runs it alone while the other
idles: the run takes about (total + that file) / 2 instead of total / 2. Handing out the files
longest first (Graham's LPT rule) keeps the tail to the shortest files.

The seconds are each file's setup + call + teardown time in one run, per tier, kept in
tests/durations.json: `{"tests/x/test_y.py": [fast_seconds, large_seconds], ...}`. Refresh it
after adding or moving slow tests:

    uv run --locked pytest -n 2 -m "large or not large" --store-durations

A file the record does not know goes first (it may be long; a short one first costs little).

>>> durations = {"a.py": [10.0, 0.0], "b.py": [1.0, 60.0], "c.py": [5.0, 0.0]}
>>> files = {"a.py": {"fast"}, "b.py": {"fast"}, "c.py": {"fast"}, "new.py": {"fast"}}
>>> sorted(files, key=lambda f: -file_seconds(f, files[f], durations))
['new.py', 'a.py', 'c.py', 'b.py']
>>> file_seconds("b.py", {"fast", "large"}, durations)
61.0
"""

from __future__ import annotations

import json
import math
import pathlib

DURATIONS_FILE = pathlib.Path(__file__).with_name("durations.json")
TIERS = ("fast", "large")


def read(path: pathlib.Path = DURATIONS_FILE) -> dict[str, list[float]]:
    """The recorded seconds (empty if the file is absent)."""
    return json.loads(path.read_text()) if path.exists() else {}


def file_seconds(file: str, tiers: set[str], durations: dict[str, list[float]]) -> float:
    """The recorded seconds of the `tiers` ("fast", "large") of `file` that this run selected;
    infinite if the record does not know the file."""
    if file not in durations:
        return math.inf
    return sum(seconds for tier, seconds in zip(TIERS, durations[file]) if tier in tiers)


def order(items: list, durations: dict[str, list[float]]) -> None:
    """Sorts pytest `items` (in place, stably) so that their files come longest first."""
    tiers: dict[str, set[str]] = {}
    for item in items:
        tiers.setdefault(_file(item), set()).add(_tier(item.keywords))
    rank = {f: -file_seconds(f, t, durations) for f, t in tiers.items()}
    items.sort(key=lambda item: rank[_file(item)])


def record(reports: list, path: pathlib.Path = DURATIONS_FILE) -> None:
    """Adds the seconds of this run's pytest `TestReport`s (setup, call and teardown) to `path`:
    each tier of a file that ran replaces its old value."""
    ran: dict[str, list[float | None]] = {}
    for report in reports:
        file = _file(report)
        tier = TIERS.index(_tier(report.keywords))
        seconds = ran.setdefault(file, [None, None])
        seconds[tier] = (seconds[tier] or 0.0) + report.duration
    durations = read(path)
    for file, seconds in ran.items():
        old = durations.get(file, [0.0, 0.0])
        durations[file] = [round(s, 1) if s is not None else o for s, o in zip(seconds, old)]
    path.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")


def _file(item_or_report) -> str:
    return item_or_report.nodeid.split("::")[0]


def _tier(keywords) -> str:
    """The tier of a test from its keywords (an item's, or a report's copy of them)."""
    return "large" if "large" in keywords else "fast"
