"""A simulation round's metrics row: its columns, and where it is recorded (`tffl.simulation.driver`).

The columns: the process's metrics flattened to `{"a/b/c": float}` (`flatten_metrics`), the
aliases `train_loss` / `train_accuracy` (`summary_metrics`) and the bytes per client of the round
(`Traffic`). The records: `metrics.csv` (`write_metrics` rewrites it atomically, `read_metrics`
reads it back with the numbers as written), TensorBoard scalars (`TensorBoardRelease`) and the
progress line (`progress_line`, with the elapsed time and ETA of `RoundClock`); `announce`
says a slow setup step is starting. `diverged` is the
driver's criterion for a training loss that blew up.

Example:

>>> flatten_metrics({"client_work": {"train": {"loss": 0.5}}, "num_clients": 2})
{'client_work/train/loss': 0.5, 'num_clients': 2.0}
>>> summary_metrics({'client_work/train/loss': 0.5})
{'train_loss': 0.5}
>>> duration(12.34), duration(65.2), duration(7530)
('12.3 s', '1 min 05 s', '2 h 05 min')
"""

from __future__ import annotations

import asyncio
import collections
import csv
import logging
import math
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication
from tffl.engine import process as process_lib
from tffl.simulation.memory import MEMORY_COLUMNS

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
# Columns that depend on the machine, not on the math: left out of resume comparisons and of
# summary.json's `final`. `data_seconds`: how long the round waited for its clients' datasets
# (not in round_seconds); the peak memory columns: `tffl.simulation.memory`.
MACHINE_COLUMNS = ("round_seconds", "evaluation_seconds", "data_seconds", *MEMORY_COLUMNS)


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


def announce(step: str) -> None:
    """`<step> ...` on the `tffl` logger (INFO) as a slow setup step starts (tokenizing, building
    a model or computations); train.py shows it as `tffl: <step> ...`
    (`runner.cli.show_progress`)."""
    logging.getLogger("tffl").info("%s ...", step)


def announcing(step: str, fn: Callable) -> Callable:
    """`fn`, announcing `step` on its first call (when a lazy step, e.g. a cache, starts)."""
    said = []

    def announced(*args, **kwargs):
        if not said:
            said.append(announce(step))
        return fn(*args, **kwargs)
    return announced


# A finite train loss above this many times the run's first-round loss (at least 1) is a
# divergence (`diverged`).
DIVERGENCE_FACTOR = 100.0


def diverged(loss: float, reference: float | None, factor: float | None = DIVERGENCE_FACTOR
             ) -> bool:
    """Whether a finite training `loss` is a clear divergence: above `factor` times
    max(|reference|, 1), `reference` being the run's first-round training loss.

    The bar is far above any healthy run: a loss only falls or wanders from its first round (a
    noisy run by a few times at most), and a cross-entropy stuck at chance (ln 2 ≈ 0.69 on two
    classes) stays below it for good; a cross-entropy of 100 nats means probabilities of e^-100
    on the true labels, reached only by logits that blew up. The floor of 1 keeps a run whose
    first loss is tiny (a regression that starts near its optimum) from stopping on noise.
    `factor` None: never.

    >>> diverged(1.6e14, 1e3), diverged(0.72, 0.69), diverged(float("nan"), 0.69)
    (True, False, False)
    """
    if factor is None or reference is None or not math.isfinite(loss):
        return False
    return loss > factor * max(abs(reference), 1.0)


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss; the last good checkpoint is kept."""


class LossDivergedError(FloatingPointError):
    """Training's loss blew up (`diverged`); the last good checkpoint is kept."""


def check_loss(row: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
               factor: float | None, stopped: Callable[[], str]) -> None:
    """`NonFiniteLossError` if the row's `train_loss` is NaN or infinite, `LossDivergedError` if
    it `diverged` from the run's first training loss (`history`'s, else this row's); `stopped()`
    ends their message (the run's learning rates, its last checkpoint)."""
    loss, round_num = row.get("train_loss"), row["round"]
    if loss is None:
        return
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"round {round_num}: training loss is {loss}{stopped()}")
    first = next(((r["round"], r["train_loss"]) for r in history if "train_loss" in r),
                 (round_num, loss))
    if diverged(loss, first[1], factor):
        raise LossDivergedError(
            f"round {round_num}: training loss {loss:.3g} is over {factor:g} times round "
            f"{first[0]}'s {first[1]:.3g}: the run diverged{stopped()}")


def duration(seconds: float) -> str:
    """A compact wall time: `12.3 s`, `1 min 05 s`, `2 h 05 min`."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class RoundClock:
    """Elapsed wall time since this process started the run (`started`: a `time.perf_counter()`
    value) and the ETA of its remaining rounds: the mean wall time of the rounds this process
    ran (training, evaluation, recording and checkpointing; a resumed run counts only its own
    rounds) times the rounds left."""

    def __init__(self, started: float):
        self.started = started
        self.loop_started = time.perf_counter()
        self.rounds_done = 0

    def tick(self, rounds_left: int) -> str:
        """Counts one round done; `<elapsed> elapsed, ETA <time>` (no ETA after the last)."""
        self.rounds_done += 1
        now = time.perf_counter()
        text = f"{duration(now - self.started)} elapsed"
        if rounds_left > 0:
            mean = (now - self.loop_started) / self.rounds_done
            text += f", ETA {duration(mean * rounds_left)}"
        return text


def progress_line(row: dict[str, Any], rounds: int, timing: str = "") -> str:
    """The round's line: `round 3/100  loss ...  acc ...  eval_* ...  up ... KiB/client  <round
    seconds>` and `timing` (`RoundClock.tick`'s elapsed time and ETA)."""
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
    if timing:
        parts.append(timing)
    return "  ".join(parts)
