"""Running an experiment: its context and result, its training runs (`run_training`: a
`RunConfig` run by `runner.run`, in this process or in a child fed by a config file; under
--estimate, its probe, `runner.estimate`), reloadable units and the small helpers the
experiment modules share (means and standard deviations, a run's curve and seconds)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from runner import estimate
from runner.cli import UsageError
from runner.report import Panel, Table, as_float, missing, read_csv
from runner.run_config import RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data"

# Display names of the methods in the tables.
METHOD_NAMES = {
    "rolora": "RoLoRA",
    "ffa_lora": "FFA-LoRA",
    "fedavg_lora": "FedAvg-LoRA",
    "flexlora": "FlexLoRA",
    "fedrep": "FedRep (personal heads, RoLoRA-alternated adapters)",
}


class StepError(RuntimeError):
    """A step (e.g. a training run) failed; reported as one line, exit status 1."""


# ------------------------------------------------------------------------------------------------
# Running things


@dataclasses.dataclass(frozen=True)
class Context:
    experiment: str
    scale: str
    output_dir: pathlib.Path
    resume: bool
    seed: int
    data_dir: pathlib.Path
    log: Callable[[str], None] = print
    # Run nothing; tables from the runs finished so far (the multi-invocation experiments).
    collect: bool = False
    # sst2_clients, sst2_dirichlet, reviews_domains: only these methods (None: all of them).
    methods: tuple[str, ...] | None = None
    # The same three: where finished runs' summary.json and metrics.csv, and a stopped run's
    # newest checkpoint, are kept (output_dir's layout; runner.archive), so that a later
    # invocation on a fresh checkout skips or resumes them.
    archive_dir: pathlib.Path | None = None
    # Each training run in a child process of its own (`python -m runner.run CONFIG.json`),
    # so that a crash ends that run only; False: in this process (`runner.run.run`).
    isolate: bool = False


@dataclasses.dataclass
class Result:
    """An experiment's output: its `table` (results.csv/.md), `panels` (results.png) and
    `extra_tables`, each written beside them as `<stem>.csv` and `<stem>.md`."""

    table: Table
    panels: list[Panel]
    plot_title: str = ""
    extra_tables: dict[str, Table] = dataclasses.field(default_factory=dict)


def _child_env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))


def train_config(ctx: Context, run_dir: pathlib.Path, **fields: Any) -> RunConfig:
    """The `RunConfig` of `fields` (by flag name) with the context's seed and data folder,
    output to `run_dir`, resuming when the context resumes (a run without checkpoints then
    starts afresh)."""
    return RunConfig().with_changes(**fields, seed=ctx.seed, data_dir=str(ctx.data_dir),
                                    output_dir=str(run_dir), resume=ctx.resume)


def run_training(config: RunConfig, what: str, isolate: bool = False) -> None:
    """Runs the training run `config` (`runner.run.run`): in this process, or with
    `isolate` in a child (`python -m runner.run CONFIG.json`, stopped with SIGTERM, then
    SIGKILL, if we are stopped). A failure raises `StepError` naming `what` in one line;
    Ctrl-C propagates. Under `estimate_experiment` the run is replaced by its probe."""
    if estimate.active_probes() is None:
        _train(config, what, isolate)
        return
    estimate.probe_run(config, what, lambda probe: _train(probe, what, isolate))


def _train(config: RunConfig, what: str, isolate: bool) -> None:
    """`run_training` without the probes: `config` run here, or in a child fed a config file
    (a temporary one: the run folder keeps its own config.json)."""
    if isolate:
        with tempfile.TemporaryDirectory(prefix="tffl_run_") as folder:
            path = pathlib.Path(folder) / "config.json"
            path.write_text(config.to_json() + "\n")
            _run_command(["-m", "runner.run", path], what)
        return
    from runner import run

    print(f"== {what} -> {config.output.output_dir}", flush=True)
    try:
        config = run.resolve(config)
        run.report(config, run.run(config))
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the run is the step's one line
        raise StepError(f"{what} failed: {_one_line(e)}") from e


def _one_line(error: BaseException) -> str:
    """The error's message on one line (its type when it has none); flags as flags."""
    from runner import run

    text = " ".join(run.flag_message(error).split())
    return text or type(error).__name__


_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Asks the Linux kernel to SIGTERM this child when its parent thread exits, even by
    SIGKILL (e.g. a `subprocess.run(timeout=...)` around reproduce.py), so an isolated training
    run never outlives the experiment: its SIGTERM handler stops its TFF workers, and `--resume`
    restarts it from its last checkpoint (`tffl.runtime.workers` does the same for the workers, with
    SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Not Linux: the SIGTERM in `_run_command`'s `finally` still applies.


def _run_command(args: Sequence[str], what: str) -> None:
    """Runs `[python, *args]` in the repository root (its output goes to ours); stops it with
    SIGTERM (then SIGKILL) if we are stopped; raises `StepError` if it fails."""
    command = [sys.executable, *map(str, args)]
    shown = [str(a).replace(f"{ROOT}{os.sep}", "") for a in args]
    print("$ python " + " ".join(shown), flush=True)
    proc = subprocess.Popen(command, cwd=ROOT, env=_child_env(), preexec_fn=_stop_with_parent)
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if code != 0:
        raise StepError(f"{what} failed (exit status {code})")


def _json_default(value):
    try:
        return value.item()  # numpy scalars
    except AttributeError:
        pass
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def save_unit(ctx: Context, key: str, value) -> None:
    """Stores a finished unit atomically in `units/<key>.json`."""
    folder = ctx.output_dir / "units"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.json.tmp"
    tmp.write_text(json.dumps(value, default=_json_default))
    tmp.replace(folder / f"{key}.json")


def load_unit(ctx: Context, key: str):
    """The stored unit `key` when resuming, else None."""
    path = ctx.output_dir / "units" / f"{key}.json"
    if ctx.resume and path.exists():
        return json.loads(path.read_text())
    return None


def need_data(ctx: Context, relative: str) -> pathlib.Path:
    """`ctx.data_dir / relative`; `UsageError` naming --data_dir if it is absent."""
    path = ctx.data_dir / relative
    if not path.exists():
        raise UsageError(f"flag --data_dir={ctx.data_dir}: {relative} not found there (the "
                         "real data ships beside the checkout as ../shared/data)")
    return path


def mean_of(values) -> float:
    """The mean of the values that are not missing; NaN for none."""
    values = [v for v in values if not missing(v)]
    return sum(values) / len(values) if values else math.nan


def sample_std(values) -> float:
    """The sample standard deviation (ddof = 1) of the values that are not missing:
    s = √(Σ (v − v̄)² / (n − 1)); NaN for fewer than two.

    >>> sample_std([1.0, 2.0, 3.0]), sample_std([3.0, 1.0]), sample_std([5.0])
    (1.0, 1.4142135623730951, nan)
    """
    values = [v for v in values if not missing(v)]
    if len(values) < 2:
        return math.nan
    m = mean_of(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def mean_std(values, spec="{:.3f}") -> str:
    """"mean ± s" with s the sample std (ddof = 1, `sample_std`); one value alone; "–" for none.

    >>> mean_std([0.8, 0.9], "{:.4f}"), mean_std([0.8]), mean_std([None])
    ('0.8500 ± 0.0707', '0.800', '–')
    """
    values = [v for v in values if not missing(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return spec.format(values[0])
    return f"{spec.format(mean_of(values))} ± {spec.format(sample_std(values))}"


def eval_curve(metrics_csv: pathlib.Path, key: str = "eval_accuracy"
               ) -> tuple[list[int], list[float]]:
    """(communication rounds, `key`) of a run's evaluated rounds (none without metrics.csv)."""
    rows = read_csv(metrics_csv) if metrics_csv.exists() else []
    points = [(int(float(r["communication_rounds"])), as_float(r.get(key)))
              for r in rows if not missing(r.get(key))]
    return [p[0] for p in points], [p[1] for p in points]


def run_seconds(run_dir: pathlib.Path) -> float:
    """Training seconds of a run, summed over its metrics rows (resume-proof)."""
    rows = read_csv(run_dir / "metrics.csv") if (run_dir / "metrics.csv").exists() else []
    return sum(as_float(r.get("round_seconds")) for r in rows
               if not missing(r.get("round_seconds")))
