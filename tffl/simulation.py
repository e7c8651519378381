"""The one simulation loop: sample clients, run `next`, record metrics, checkpoint, resume.

Every algorithm in tffl runs through `run_rounds`. Per round `t = 1..rounds` it

1. asks the sampler for the round's client ids (a pure function of the seed and `t`);
2. builds each chosen client's dataset with `client_dataset_fn(client_id, t)`: with `prefetch`
   (the default) on a background thread while round t − 1 runs, so that building it (e.g. a
   text task's frozen-prefix outputs and round files, `tasks.prefix_cache`) overlaps the TFF
   computation instead of following it; the datasets and their order are the same either way;
3. calls `process.next(state, datasets)` and flattens the returned metrics;
4. optionally evaluates the new state (`evaluate_fn`), every `eval_every` rounds and at the end;
5. appends a row to `<output_dir>/metrics.csv`, releases its numbers as TensorBoard scalars to
   `<output_dir>/tensorboard` (`tff.program.TensorBoardReleaseManager`, step = round), prints a
   progress line, and checkpoints the state.

Personalized processes (`tffl.personal_state`: stateful clients, e.g. FedRep's heads) also get
the round's clients' personal states, looked up in a store keyed by client id; what `next` returns
is written back, clients that were not sampled keep theirs, and the store is saved in every
checkpoint (and restored on resume). Their `evaluate_fn` receives `(state, store)`.

Resuming (`resume=True`) loads the newest checkpoint in `<output_dir>/checkpoints`, checks that it
was written with the same configuration, drops any `metrics.csv` rows after it, and continues at
the next round; because sampling and client data depend only on `(seed, t)`, the resumed run's
metrics equal an uninterrupted run's.

Example:

>>> from tffl import participation                    # `process`: RoLoRA on clients a, b
>>> def client_dataset_fn(client_id, round_num):
...     return datasets[client_ids.index(client_id)]
>>> with runtime.local_runtime():
...     result = run_rounds(process, participation.FullParticipation(client_ids),
...                         client_dataset_fn, rounds=4, output_dir=run_dir / "sim", log=None,
...                         tensorboard=False)
>>> [(row["round"], row["bytes_up_per_client"]) for row in result.history]  # B round, A round
[(1, 188), (2, 188), (3, 188), (4, 188)]
"""

from __future__ import annotations

import asyncio
import collections
import csv
import dataclasses
import math
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import checkpoint
from tffl import communication
from tffl import personal_state
from tffl import processes
from tffl.participation import Participation
from tffl import runtime as _runtime  # noqa: F401  (its exit hook stops every TFF worker)

METRICS_FILE = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
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


class Sampler(Protocol):
    def sample(self, round_num: int) -> Participation: ...


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss; the last good checkpoint is kept."""


class ResumeError(ValueError):
    """The output directory holds a run that cannot be continued as asked."""


@dataclasses.dataclass
class SimulationResult:
    state: Any
    history: list[dict[str, Any]]
    first_round: int  # the first round this call ran (1 for a fresh run)
    # The personal-state store of a personalized process (None otherwise).
    personal_store: personal_state.PersonalStore | None = None


def flatten_metrics(metrics: Any, prefix: str = "") -> dict[str, float]:
    """Nested metrics (dicts, attrs, tuples) as `{"a/b/c": float}`; empty structures vanish."""
    flat = {}
    if isinstance(metrics, Mapping):
        items = metrics.items()
    elif hasattr(metrics, "_asdict"):
        items = metrics._asdict().items()
    elif isinstance(metrics, list | tuple):
        items = ((str(i), v) for i, v in enumerate(metrics))
    else:
        value = np.asarray(metrics.numpy() if hasattr(metrics, "numpy") else metrics)
        if value.size == 1:
            return {prefix: float(value.reshape(()))}
        return {f"{prefix}/{i}": float(v) for i, v in enumerate(value.reshape(-1))}
    for key, value in items:
        flat.update(flatten_metrics(value, f"{prefix}/{key}" if prefix else str(key)))
    return flat


def _summary_metrics(flat: dict[str, float]) -> dict[str, float]:
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


class _Traffic:
    """Bytes per client for each row. A `tffl.processes` process declares them per round kind
    (read off its TFF types) and says which kind `next` runs; for any other `LearningProcess` they
    are read off `process.next`'s DistributeAggregateForm (`tffl.communication.round_traffic`)."""

    def __init__(self, process: Any, say: Callable[[str], None]):
        self.process = process
        self.scheduled = isinstance(process, processes.RoundProtocol)
        self.whole: communication.RoundTraffic | None = None
        if self.scheduled:
            return
        try:
            self.whole = communication.round_traffic(process.next)
        except (ValueError, TypeError, AttributeError) as e:
            say(f"note: bytes per client not reported: {e}")

    def columns(self, state: Any, client_ids: Sequence[str] = ()) -> dict[str, float]:
        """The traffic of the communication round that `next(state, ...)` runs (the mean over
        `client_ids` for a process whose clients differ, e.g. `tffl.lora_ranks`')."""
        if self.scheduled and hasattr(self.process, "client_traffic"):
            traffic = self.process.client_traffic(self.process.round_name(state), client_ids)
        else:
            traffic = (self.process.traffic[self.process.round_name(state)] if self.scheduled
                       else self.whole)
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


def _parse_number(value: str) -> int | float:
    try:
        return int(value)
    except ValueError:
        return float(value)


def _write_metrics(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
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


class _TensorBoardRelease:
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


def _progress_line(row: dict[str, Any], rounds: int) -> str:
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


class _RoundData:
    """The clients' datasets of a round, built now or, with `prefetch`, on a background thread
    started during the previous round (`start`); `take` returns them (and raises whatever
    building them raised). Each round's participation is sampled once, in round order."""

    def __init__(self, sampler: Sampler, client_dataset_fn, prefetch: bool):
        self._sampler, self._fn, self._prefetch = sampler, client_dataset_fn, prefetch
        self._pending = None  # (round_num, participation, thread, result box)

    def _build(self, participation: Participation, round_num: int) -> list:
        return [self._fn(cid, round_num) for cid in participation.client_ids]

    def start(self, round_num: int) -> None:
        """Starts building round `round_num`'s datasets in the background (with `prefetch`)."""
        if not self._prefetch:
            return
        participation, box = self._sampler.sample(round_num), {}

        def build():
            try:
                box["datasets"] = self._build(participation, round_num)
            except BaseException as e:  # re-raised by `take`, in the loop's thread
                box["error"] = e

        thread = threading.Thread(target=build, name=f"tffl-round-{round_num}-data",
                                  daemon=True)
        thread.start()
        self._pending = (round_num, participation, thread, box)

    def take(self, round_num: int) -> tuple[Participation, list]:
        if self._pending is None or self._pending[0] != round_num:
            self.wait()
            participation = self._sampler.sample(round_num)
            return participation, self._build(participation, round_num)
        _, participation, thread, box = self._pending
        self._pending = None
        thread.join()
        if "error" in box:
            raise box["error"]
        return participation, box["datasets"]

    def wait(self) -> None:
        """Lets a background build finish (its result is dropped): nothing writes after the
        loop returns."""
        if self._pending is not None:
            self._pending[2].join()
            self._pending = None


def run_rounds(
    process: Any,
    sampler: Sampler,
    client_dataset_fn: Callable[[str, int], tf.data.Dataset],
    rounds: int,
    output_dir: os.PathLike | str,
    evaluate_fn: Callable[..., Mapping[str, float]] | None = None,
    eval_every: int = 0,
    checkpoint_every: int = 1,
    config: Mapping[str, Any] | None = None,
    resume: bool = False,
    log: Callable[[str], None] | None = print,
    tensorboard: bool = True,
    until: Callable[[Mapping[str, Any]], bool] | None = None,
    after_round: Callable[[Mapping[str, Any], Any], None] | None = None,
    initial_state: Any = None,
    prefetch: bool = True,
) -> SimulationResult:
    """Runs `rounds` rounds of `process` (see the module docstring).

    Args:
      process: has `initialize()` and `next(state, client_datasets)`; `next` returns either a
        `tff.learning.templates.LearningProcessOutput` or a `(state, metrics)` pair. A
        personalized process (`tffl.personal_state.is_personalized`) has
        `next(state, client_datasets, personal_states)` returning a `PersonalizedOutput`.
      sampler: picks each round's clients (`UniformSampler`, `FullParticipation`, SRPFL, ...).
      client_dataset_fn: `(client_id, round_num) -> tf.data.Dataset` for that client's round.
      rounds: total rounds of the run (a resumed run stops at the same total).
      output_dir: where `metrics.csv` and `checkpoints/` go.
      evaluate_fn: `state -> {name: value}` (`(state, personal_store) -> ...` for a personalized
        process); reported as `eval_<name>`.
      eval_every: evaluate every this many rounds (0: only after the last round).
      checkpoint_every: checkpoint every this many rounds (the last round always).
      config: the run's configuration, stored with checkpoints; resuming with a different
        configuration raises `ResumeError`.
      resume: continue from the newest checkpoint in `output_dir` if there is one. Without it, an
        `output_dir` that already holds checkpoints raises `ResumeError` (nothing is overwritten).
      log: where progress lines go (`None`: silent).
      tensorboard: also release every row's numbers to `<output_dir>/tensorboard` (view with
        `tensorboard --logdir <output_dir>`). A resumed run re-releases the rounds after its
        checkpoint, so TensorBoard shows the resumed values for those steps.
      until: `row -> bool`; the run stops after the first round whose metrics row (with its
        `eval_*` values) satisfies it, e.g. a target accuracy (that round is checkpointed).
      after_round: `(row, state) -> None`, called after each round is recorded (e.g. to run
        other work between rounds, as `scripts/benchmark.py` runs its baseline).
      initial_state: the state round 1 starts from (default `process.initialize()`), e.g. a
        method-of-moments initialization; it must have `initialize()`'s structure (it is the
        template checkpoints are loaded into).
      prefetch: build round t + 1's datasets on a background thread while round t runs (step
        2 above). `client_dataset_fn` must then be safe to call from another thread while
        `process.next` and `evaluate_fn` run (the text tasks' `tasks.prefix_cache` is).

    Returns:
      A `SimulationResult` with the final state and every round's metrics row (resumed runs
      include the rows from before the interruption).
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be at least 1")
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    metrics_path = output_dir / METRICS_FILE
    config = dict(config or {})
    say = log or (lambda _: None)

    state = process.initialize() if initial_state is None else initial_state
    # The frozen (never federated) weights the state belongs to; checkpoints record it.
    fingerprint = (process.frozen_fingerprint if isinstance(process, processes.RoundProtocol)
                   else None)
    personalized = personal_state.is_personalized(process)
    store = personal_state.PersonalStore(process.initialize_personal) if personalized else None
    history: list[dict[str, Any]] = []
    first_round = 1
    found = checkpoint.latest(checkpoint_dir)
    if found is not None:
        done, path = found
        if not resume:
            raise ResumeError(
                f"{output_dir} already holds a run (checkpoint of round {done}); pass --resume to "
                "continue it, or choose another --output_dir"
            )
        state, extra, meta = checkpoint.load(path, template=state)
        saved = meta.get("frozen_fingerprint")
        if saved != fingerprint:
            raise ResumeError(
                f"cannot resume {output_dir}: its checkpoints were trained on frozen weights "
                f"{saved}, this model's are {fingerprint} (another pretrained checkpoint, "
                "backbone or model seed?); use the original model or another --output_dir")
        if meta["config"] != config:
            changed = sorted(
                k for k in set(meta["config"]) | set(config)
                if meta["config"].get(k) != config.get(k)
            )
            raise ResumeError(
                f"cannot resume {output_dir}: its run used a different configuration "
                f"(differs in: {', '.join(changed)}); use the original flags or another "
                "--output_dir"
            )
        if store is not None:
            store.load_arrays(extra)
        if metrics_path.exists():
            history = [r for r in read_metrics(metrics_path) if r["round"] <= done]
        first_round = done + 1
        say(f"resuming {output_dir} after round {done}")
        if first_round > rounds or (until is not None and history and until(history[-1])):
            say(f"run already complete ({done} of {rounds} rounds)")
            return SimulationResult(state, history, first_round, store)

    traffic = _Traffic(process, say)
    release = _TensorBoardRelease(output_dir / TENSORBOARD_DIR) if tensorboard else None
    communication_rounds = int(history[-1].get("communication_rounds", 0)) if history else 0

    round_data = _RoundData(sampler, client_dataset_fn, prefetch)
    try:
        for round_num in range(first_round, rounds + 1):
            waited = time.perf_counter()
            participation, datasets = round_data.take(round_num)
            data_seconds = time.perf_counter() - waited
            if round_num < rounds:
                round_data.start(round_num + 1)  # built while this round runs
            traffic_columns = traffic.columns(state, participation.client_ids)
            start = time.perf_counter()
            if store is not None:
                output = process.next(state, datasets, store.lookup(participation.client_ids))
                store.update(participation.client_ids, output.personal_states)
            else:
                output = process.next(state, datasets)
            seconds = time.perf_counter() - start
            if hasattr(output, "state"):
                state, metrics = output.state, output.metrics
            else:
                state, metrics = output
            flat = flatten_metrics(metrics)
            row: dict[str, Any] = {"round": round_num, "clients": len(participation.client_ids)}
            row.update(_summary_metrics(flat))
            row.update(traffic_columns)
            communication_rounds += 1
            row["communication_rounds"] = communication_rounds
            row["round_seconds"] = seconds
            row["data_seconds"] = data_seconds
            row.update(participation.info)
            row.update(flat)
            loss = row.get("train_loss")
            if loss is not None and not math.isfinite(loss):
                raise NonFiniteLossError(
                    f"round {round_num}: training loss is {loss}; the run stopped and its last "
                    f"good checkpoint is kept in {checkpoint_dir}. Lower the learning rate and "
                    "rerun with a fresh --output_dir."
                )
            is_last = round_num == rounds
            evaluate_now = is_last or (eval_every and round_num % eval_every == 0)
            if evaluate_fn is not None and evaluate_now:
                eval_start = time.perf_counter()
                evaluated = evaluate_fn(state, store) if store is not None else evaluate_fn(state)
                for key, value in evaluated.items():
                    row[f"eval_{key}"] = float(value)
                row["evaluation_seconds"] = time.perf_counter() - eval_start
            stop = until is not None and bool(until(row))
            is_last = is_last or stop
            history.append(row)
            _write_metrics(metrics_path, history)
            if release is not None:
                release(row)
            if is_last or round_num % checkpoint_every == 0:
                checkpoint.save(checkpoint_dir, round_num, state, config=config,
                                extra=store.to_arrays() if store is not None else None,
                                frozen_fingerprint=fingerprint)
            say(_progress_line(row, rounds))
            if after_round is not None:
                after_round(row, state)
            if stop:
                break
    finally:
        round_data.wait()
    return SimulationResult(state, history, first_round, store)
