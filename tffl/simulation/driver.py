"""The one simulation loop: sample clients, run `next`, record metrics, checkpoint, resume.

Every algorithm in tffl runs through `run_rounds`. Per round `t = 1..rounds` it

1. asks the sampler for the round's client ids (a pure function of the seed and `t`);
2. builds each chosen client's dataset with `client_dataset_fn(client_id, t)`: with `prefetch`
   (the default) on a background thread while round t − 1 runs, so that building it (e.g. a
   text task's frozen-prefix outputs and round files, `tasks.prefix_cache`) overlaps the TFF
   computation instead of following it; the datasets and their order are the same either way;
3. calls `process.next_round(state, datasets)` (a `tffl.engine.process.Process`: one
   communication round; any other process: its `next`) and flattens the returned metrics;
4. optionally evaluates the new state (`evaluate_fn`), every `eval_every` rounds and at the end;
5. appends a row to `<output_dir>/metrics.csv`, releases its numbers as TensorBoard scalars to
   `<output_dir>/tensorboard` (`tff.program.TensorBoardReleaseManager`, step = round), prints a
   progress line (with the elapsed time and the remaining rounds' ETA), checkpoints the state.

A NaN or infinite training loss (`metrics_log.NonFiniteLossError`) or a diverged one
(`metrics_log.LossDivergedError`: above `divergence_factor` times max(1, the first round's),
`metrics_log.diverged`) stops the run
before the round is recorded: the last good checkpoint stays; the message names the `config`'s
learning rates.

Building the row's columns and writing and reading those records is
`tffl.simulation.metrics_log`'s job.

Personalized processes (`Process.personal` declared: stateful clients, e.g. FedRep's heads) also get
the round's clients' personal states, looked up in a store keyed by client id; what `next` returns
is written back, clients that were not sampled keep theirs, and the store is saved in every
checkpoint (and restored on resume). Their `evaluate_fn` receives `(state, store)`.

Resuming (`resume=True`) loads the newest checkpoint in `<output_dir>/checkpoints`, checks that it
was written with the same configuration, drops any `metrics.csv` rows after it, and continues at
the next round; because sampling and client data depend only on `(seed, t)`, the resumed run's
metrics equal an uninterrupted run's.

Example:

>>> from tffl.simulation import participation                    # `process`: RoLoRA on clients a, b
>>> def client_dataset_fn(client_id, round_num):
...     return datasets[client_ids.index(client_id)]
>>> with runtime.local_runtime():
...     result = run_rounds(process, participation.FullParticipation(client_ids),
...                         client_dataset_fn, 4, run_dir / "sim",
...                         RunOptions(log=None, tensorboard=False))
>>> [(row["round"], row["bytes_up_per_client"]) for row in result.history]  # B round, A round
[(1, 188), (2, 188), (3, 188), (4, 188)]
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import tensorflow as tf

from tffl.simulation import checkpoint
from tffl.simulation import memory
from tffl.simulation import metrics_log
import tensorflow_federated as tff

from tffl.engine import personal_state
from tffl.engine import process as process_lib
from tffl.simulation.participation import Participation
from tffl.runtime import distribute  # tffl.runtime's exit hook stops every TFF worker

METRICS_FILE = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"


class Sampler(Protocol):
    def sample(self, round_num: int) -> Participation: ...


class ResumeError(ValueError):
    """The output directory holds a run that cannot be continued as asked."""


@dataclasses.dataclass
class SimulationResult:
    state: Any
    history: list[dict[str, Any]]
    first_round: int  # the first round this call ran (1 for a fresh run)
    # The personal-state store of a personalized process (None otherwise).
    personal_store: personal_state.PersonalStore | None = None


@dataclasses.dataclass
class _Run:
    """One `run_rounds` call's settings and what its rounds share (see `run_rounds`' arguments)."""

    process: Any
    rounds: int
    output_dir: pathlib.Path
    config: dict[str, Any]
    say: Callable[[str], None]
    # The frozen (never federated) weights the state belongs to; checkpoints record it.
    fingerprint: Any
    store: personal_state.PersonalStore | None
    evaluate_fn: Callable[..., Mapping[str, float]] | None
    eval_every: int
    checkpoint_every: int
    until: Callable[[Mapping[str, Any]], bool] | None
    after_round: Callable[[Mapping[str, Any], Any], None] | None
    divergence_factor: float | None
    started: float  # `time.perf_counter()` when this process started the run

    checkpoint_dir = property(lambda self: self.output_dir / CHECKPOINT_DIR)
    metrics_path = property(lambda self: self.output_dir / METRICS_FILE)


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
        """Lets a background build finish (its result dropped): nothing writes after the loop."""
        if self._pending is not None:
            self._pending[2].join()
            self._pending = None


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How `run_rounds` evaluates, records, checkpoints and resumes a run.

    Attributes:
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
        2 of the module docstring). `client_dataset_fn` must then be safe to call from another
        thread while `process.next` and `evaluate_fn` run (the text tasks' `tasks.prefix_cache`
        is).
      divergence_factor: stop (`metrics_log.LossDivergedError`) at a finite training loss above this many
        times max(1, the run's first-round training loss); None: never.
    """

    evaluate_fn: Callable[..., Mapping[str, float]] | None = None
    eval_every: int = 0
    checkpoint_every: int = 1
    config: Mapping[str, Any] | None = None
    resume: bool = False
    log: Callable[[str], None] | None = print
    tensorboard: bool = True
    until: Callable[[Mapping[str, Any]], bool] | None = None
    after_round: Callable[[Mapping[str, Any], Any], None] | None = None
    initial_state: Any = None
    prefetch: bool = True
    divergence_factor: float | None = metrics_log.DIVERGENCE_FACTOR


def run_rounds(
    process: Any,
    sampler: Sampler,
    client_dataset_fn: Callable[[str, int], tf.data.Dataset],
    rounds: int,
    output_dir: os.PathLike | str,
    options: RunOptions = RunOptions(),
) -> SimulationResult:
    """Runs `rounds` rounds of `process` (see the module docstring).

    Args:
      process: a `tffl.engine.process.Process` (its `next_round` runs each communication
        round; a personalized one, `process.personal` declared, also takes and returns the
        clients' personal states), or any other process with `initialize()` and
        `next(state, client_datasets)` returning a `tff.learning.templates.
        LearningProcessOutput` or a `(state, metrics)` pair (e.g. `tff.learning.algorithms`').
      sampler: picks each round's clients (`UniformSampler`, `FullParticipation`, SRPFL, ...).
      client_dataset_fn: `(client_id, round_num) -> tf.data.Dataset` for that client's round.
      rounds: total rounds of the run (a resumed run stops at the same total).
      output_dir: where `metrics.csv` and `checkpoints/` go.
      options: evaluation, checkpoints, resuming and logging (`RunOptions`).

    Returns:
      A `SimulationResult` with the final state and every round's metrics row (resumed runs
      include the rows from before the interruption).
    """
    started = time.perf_counter()
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be at least 1")
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    o = options
    config = dict(o.config or {})
    say = o.log or (lambda _: None)
    state = process.initialize() if o.initial_state is None else o.initial_state
    ours = isinstance(process, process_lib.Process)
    fingerprint = process.frozen_fingerprint if ours else None
    personalized = ours and process.personal is not None
    store = personal_state.PersonalStore(process.initialize_personal) if personalized else None
    run = _Run(process, rounds, output_dir, config, say, fingerprint, store, o.evaluate_fn,
               o.eval_every, o.checkpoint_every, o.until, o.after_round, o.divergence_factor,
               started)
    state, history, first_round, complete = _resume(run, state, o.resume)
    if not complete:
        state = _run_loop(run, state, history, first_round, sampler, client_dataset_fn,
                          o.prefetch, o.tensorboard)
    return SimulationResult(state, history, first_round, store)


def _resume(run: _Run, state: Any,
            resume: bool) -> tuple[Any, list[dict[str, Any]], int, bool]:
    """Where the run starts: `(state, [], 1, False)` without a checkpoint in `output_dir`; else
    the newest checkpoint's state (and personal store), checked against the run (`ResumeError` if
    it cannot be continued), the `metrics.csv` rows up to its round, the next round, and whether
    the run is already complete (all rounds done, or `until` met by the last row)."""
    found = checkpoint.latest(run.checkpoint_dir)
    if found is None:
        return state, [], 1, False
    done, path = found
    if not resume:
        raise ResumeError(
            f"{run.output_dir} already holds a run (checkpoint of round {done}); pass --resume to "
            "continue it, or choose another --output_dir"
        )
    state, extra, meta = checkpoint.load(path, template=state,
                                         variable_names=checkpoint.variable_names(run.process))
    saved = meta.get("frozen_fingerprint")
    if saved != run.fingerprint:
        raise ResumeError(
            f"cannot resume {run.output_dir}: its checkpoints were trained on frozen weights "
            f"{saved}, this model's are {run.fingerprint} (another pretrained checkpoint, "
            "backbone or model seed?); use the original model or another --output_dir")
    if meta["config"] != run.config:
        changed = sorted(
            k for k in set(meta["config"]) | set(run.config)
            if meta["config"].get(k) != run.config.get(k)
        )
        raise ResumeError(
            f"cannot resume {run.output_dir}: its run used a different configuration "
            f"(differs in: {', '.join(changed)}); use the original flags or another "
            "--output_dir"
        )
    if run.store is not None:
        run.store.load_arrays(extra)
    history: list[dict[str, Any]] = []
    if run.metrics_path.exists():
        history = [r for r in metrics_log.read_metrics(run.metrics_path) if r["round"] <= done]
    first_round = done + 1
    run.say(f"resuming {run.output_dir} after round {done}")
    if first_round > run.rounds or (run.until is not None and history and run.until(history[-1])):
        run.say(f"run already complete ({done} of {run.rounds} rounds)")
        return state, history, first_round, True
    return state, history, first_round, False


def _run_loop(run: _Run, state: Any, history: list[dict[str, Any]], first_round: int,
              sampler: Sampler, client_dataset_fn: Callable[[str, int], tf.data.Dataset],
              prefetch: bool, tensorboard: bool) -> Any:
    """Rounds `first_round`..`run.rounds` (fewer if `run.until` stops the run): each one trained,
    checked, evaluated when due, appended to `history` and recorded; returns the final state."""
    traffic = metrics_log.Traffic(run.process, run.say)
    release = (metrics_log.TensorBoardRelease(run.output_dir / TENSORBOARD_DIR) if tensorboard
               else None)
    communication_rounds = int(history[-1].get("communication_rounds", 0)) if history else 0
    round_data = _RoundData(sampler, client_dataset_fn, prefetch)
    clock = metrics_log.RoundClock(run.started)
    try:
        for round_num in range(first_round, run.rounds + 1):
            communication_rounds += 1
            state, row = _train_round(run, state, traffic, round_data, round_num,
                                      communication_rounds)
            metrics_log.check_loss(row, history, run.divergence_factor, lambda: _stopped(run))
            is_last = round_num == run.rounds
            evaluate_now = is_last or (run.eval_every and round_num % run.eval_every == 0)
            if run.evaluate_fn is not None and evaluate_now:
                _evaluate(run, state, row)
            row.update(memory.memory_columns())   # peaks so far, evaluation included
            stop = run.until is not None and bool(run.until(row))
            is_last = is_last or stop
            history.append(row)
            metrics_log.write_metrics(run.metrics_path, history)
            if release is not None:
                release(row)
            if is_last or round_num % run.checkpoint_every == 0:
                checkpoint.save(run.checkpoint_dir, round_num, state, config=run.config,
                                extra=run.store.to_arrays() if run.store is not None else None,
                                frozen_fingerprint=run.fingerprint,
                                variable_names=checkpoint.variable_names(run.process))
            run.say(metrics_log.progress_line(row, run.rounds, clock.tick(
                0 if stop else run.rounds - round_num)))
            if run.after_round is not None:
                run.after_round(row, state)
            if stop:
                break
    finally:
        round_data.wait()
    return state


def _train_round(run: _Run, state: Any, traffic: metrics_log.Traffic, round_data: _RoundData,
                 round_num: int, communication_rounds: int) -> tuple[Any, dict[str, Any]]:
    """Round `round_num`'s training: takes its clients' datasets (and starts building the next
    round's), runs the process on them and returns the new state and the round's metrics row
    (without evaluation)."""
    waited = time.perf_counter()
    participation, datasets = round_data.take(round_num)
    data_seconds = time.perf_counter() - waited
    if round_num < run.rounds:
        round_data.start(round_num + 1)  # built while this round runs
    traffic_columns = traffic.columns(state, participation.client_ids)
    kind = run.process.round_name(state) if traffic.ours else "next"
    start = time.perf_counter()
    # A `tffl.engine.process.Process` runs one communication round (`next_round`); any
    # other process, one `next`.
    step = run.process.next_round if traffic.ours else run.process.next
    if run.store is not None:
        output = step(state, datasets, run.store.lookup(participation.client_ids))
        run.store.update(participation.client_ids, output.personal_states)
    else:
        output = step(state, datasets)
    seconds = time.perf_counter() - start
    distribute.report_round_devices(kind)  # under --runtime=distribute, once per round kind
    if isinstance(output, (tff.learning.templates.LearningProcessOutput,
                           personal_state.PersonalizedOutput)):
        state, metrics = output.state, output.metrics
    else:
        state, metrics = output
    flat = metrics_log.flatten_metrics(metrics)
    row: dict[str, Any] = {"round": round_num, "clients": len(participation.client_ids)}
    row.update(metrics_log.summary_metrics(flat))
    row.update(traffic_columns)
    row["communication_rounds"] = communication_rounds
    row.update(round_seconds=seconds, data_seconds=data_seconds)
    row.update(participation.info)
    row.update(flat)
    return state, row


def _stopped(run: _Run) -> str:
    """The end of a stopped run's message: its learning rates, its last checkpoint, what to do."""
    rates = ", ".join(f"{k}={v}" for k, v in sorted(run.config.items())
                      if k.endswith("learning_rate"))
    found = checkpoint.latest(run.checkpoint_dir)
    kept = (f"its last good checkpoint (round {found[0]}) is kept in {run.checkpoint_dir}"
            if found else "no round was checkpointed")
    return (f"{f' with {rates}' if rates else ''}; the run stopped and {kept}. Lower the "
            "learning rate and rerun with a fresh --output_dir.")


def _evaluate(run: _Run, state: Any, row: dict[str, Any]) -> None:
    """Adds `eval_<name>` (from `run.evaluate_fn`) and `evaluation_seconds` to `row`."""
    eval_start = time.perf_counter()
    evaluated = (run.evaluate_fn(state, run.store) if run.store is not None
                 else run.evaluate_fn(state))
    for key, value in evaluated.items():
        row[f"eval_{key}"] = float(value)
    row["evaluation_seconds"] = time.perf_counter() - eval_start
