"""A simulation round's metrics row: its columns, and where it is recorded (`tffl.simulation.driver`).

The columns: the process's metrics flattened to `{"a/b/c": float}` (`flatten_metrics`), the
aliases `train_loss` / `train_accuracy` (`summary_metrics`) and the bytes per client of the round
(`Traffic`). The records: `metrics.csv` (`write_metrics` rewrites it atomically, `read_metrics`
reads it back with the numbers as written), TensorBoard scalars (`TensorBoardRelease`) and the
progress line (`progress_line`).

Example:

>>> flatten_metrics({"client_work": {"train": {"loss": 0.5}}, "num_clients": 2})
{'client_work/train/loss': 0.5, 'num_clients': 2.0}
>>> summary_metrics({'client_work/train/loss': 0.5})
{'train_loss': 0.5}
"""

from __future__ import annotations

import asyncio
import collections
import csv
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication
from tffl.engine import process as process_lib

# Columns first in metrics.csv, in this order; any other metric follows, sorted by name.
_LEADING_COLUMNS = (
    "round",
    "communication_rounds",
    "clients",
    "train_loss",
    "train_accuracy",
    "bytes_down_per_client",
    "bytes_up_per_client",
    "round_seconds",
)
# Columns that depend on the machine, not on the math: left out of resume comparisons.
# `data_seconds`: how long the round waited for its clients' datasets (not in round_seconds).
TIMING_COLUMNS = ("round_seconds", "evaluation_seconds", "data_seconds")


def flatten_metrics(metrics: Any, prefix: str = "") -> dict[str, float | str]:
    """Nested metrics (dicts, attrs, tuples) as `{"a/b/c": float}`; strings (e.g. a switch
    round's `finalizer/round_kind`) as `str`; empty structures vanish."""
    flat = {}
    if isinstance(metrics, Mapping):
        items = metrics.items()
    elif hasattr(metrics, "_asdict"):
        items = metrics._asdict().items()
    elif isinstance(metrics, list | tuple):
        items = ((str(i), v) for i, v in enumerate(metrics))
    else:
        value = np.asarray(metrics.numpy() if hasattr(metrics, "numpy") else metrics)
        if value.dtype.kind in "SOU":
            text = [v.decode() if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
            return {prefix: text[0]} if value.size == 1 else {
                f"{prefix}/{i}": v for i, v in enumerate(text)}
        if value.size == 1:
            return {prefix: float(value.reshape(()))}
        return {f"{prefix}/{i}": float(v) for i, v in enumerate(value.reshape(-1))}
    for key, value in items:
        flat.update(flatten_metrics(value, f"{prefix}/{key}" if prefix else str(key)))
    return flat


def summary_metrics(flat: dict[str, float]) -> dict[str, float]:
    """Short aliases `train_loss` / `train_accuracy` for the process's training metrics (the last
    ones reported: for a `next` of several communication rounds, those of its last round)."""
    out = {}
    for key, value in flat.items():
        parts = key.split("/")
        if "train" not in parts:
            continue
        if parts[-1] == "loss":
            out["train_loss"] = value
        elif parts[-1].endswith("accuracy"):
            out["train_accuracy"] = value
    return out


class Traffic:
    """Bytes per client for each row. A `tffl.engine.process.Process` reports them per round kind
    (`client_traffic`) and says which kind the next round runs; for any other process whose
    `next` is a `tff.Computation` they are read off its DistributeAggregateForm
    (`tffl.engine.communication.round_traffic`)."""

    def __init__(self, process: Any, say: Callable[[str], None]):
        self.process = process
        self.ours = isinstance(process, process_lib.Process)
        self.whole: communication.RoundTraffic | None = None
        if self.ours:
            return
        if not isinstance(process.next, tff.Computation):
            say("note: bytes per client not reported: the process's next is not a "
                "tff.Computation")
            return
        try:
            self.whole = communication.round_traffic(process.next)
        except (ValueError, TypeError) as e:
            say(f"note: bytes per client not reported: {e}")

    def columns(self, state: Any, client_ids: Sequence[str] = ()) -> dict[str, float]:
        """The traffic of the communication round that `next_round(state, ...)` runs (the mean
        over `client_ids` for a process whose clients differ, e.g. `tffl.algorithms.lora_ranks`')."""
        traffic = (self.process.client_traffic(self.process.round_name(state), client_ids)
                   if self.ours else self.whole)
        if traffic is None:
            return {}
        return {"bytes_down_per_client": traffic.down, "bytes_up_per_client": traffic.up}


def read_metrics(path: os.PathLike | str) -> list[dict[str, Any]]:
    """Rows of a `metrics.csv`, with numbers parsed as they were written: an integer (`round`,
    `clients`, the bytes per client) as int, any other number as float, so that a resumed run
    rewrites its earlier rows unchanged."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rows.append({key: _parse_number(value) for key, value in row.items()
                         if value not in ("", None)})
    return rows


def _parse_number(value: str) -> int | float | str:
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value   # a string metric (e.g. `finalizer/round_kind`)


def write_metrics(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
    """Writes all rows to `path` atomically (temp file + rename)."""
    keys = {k for row in rows for k in row}
    columns = [c for c in _LEADING_COLUMNS if c in keys] + sorted(keys - set(_LEADING_COLUMNS))
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _format(v) for k, v in row.items()})
    os.replace(tmp, path)


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return value


class TensorBoardRelease:
    """Releases a metrics row's numbers as TensorBoard scalars, step = the row's round, with
    TFF's `tff.program.TensorBoardReleaseManager` (its `release` is a coroutine)."""

    def __init__(self, summary_dir: pathlib.Path):
        self._manager = tff.program.TensorBoardReleaseManager(summary_dir)

    def __call__(self, row: Mapping[str, Any]) -> None:
        numbers = collections.OrderedDict(
            (key, float(value)) for key, value in row.items()
            if key != "round" and isinstance(value, (int, float, np.number))
            and not isinstance(value, bool))
        asyncio.run(self._manager.release(numbers, key=int(row["round"])))


def progress_line(row: dict[str, Any], rounds: int) -> str:
    width = len(str(rounds))
    parts = [f"round {row['round']:>{width}}/{rounds}"]
    for key, label in (("train_loss", "loss"), ("train_accuracy", "acc")):
        if key in row:
            parts.append(f"{label} {row[key]:.4f}")
    for key, value in row.items():
        if key.startswith("eval_"):
            parts.append(f"{key} {value:.4f}")
    if "bytes_up_per_client" in row:
        parts.append(f"up {row['bytes_up_per_client'] / 1024:.1f} KiB/client")
    parts.append(f"{row['round_seconds']:.2f} s")
    return "  ".join(parts)
