"""Running an experiment: its context and result, train.py subprocesses, --estimate's probes,
reloadable units and small numeric helpers."""

from __future__ import annotations

import csv
import ctypes
import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from experiments.cli import UsageError

from experiments.report import Panel, Table, _missing


ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
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
    """A step (e.g. a subprocess) failed; reported as one line, exit status 1."""


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
    # Run nothing; tables from the runs finished so far (the multi-sitting experiments).
    collect: bool = False
    # sst2_clients, sst2_dirichlet, reviews_domains: only these methods (None: all of them).
    methods: tuple[str, ...] | None = None
    # The same three: where finished runs' summary.json and metrics.csv, and a stopped run's
    # newest checkpoint, are kept (output_dir's layout; experiments.archive), so that a later
    # sitting on a fresh checkout skips or resumes them.
    archive_dir: pathlib.Path | None = None


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


ESTIMATE_PROBE_ROUNDS = 4


@dataclasses.dataclass
class Probe:
    """One train.py run's probe: the rounds and evaluations the real run would do, and the
    probe's wall time, per-round and per-evaluation seconds."""

    what: str
    rounds: int
    evaluations: int
    wall_seconds: float
    round_seconds: list[float]
    evaluation_seconds: list[float]

    def predicted_seconds(self) -> float:
        """startup + first-round compile + R·t_round + E·t_eval, with t_round (t_eval) the mean
        of the probe's later rounds (evaluations) and startup what the probe spent outside them."""
        rounds, evals = self.round_seconds, self.evaluation_seconds
        t_round = sum(rounds[1:]) / max(1, len(rounds) - 1) if len(rounds) > 1 else rounds[0]
        t_eval = (sum(evals[1:]) / (len(evals) - 1) if len(evals) > 1
                  else (evals[0] if evals else 0.0))
        startup = self.wall_seconds - sum(rounds) - sum(evals)
        compile_extra = max(0.0, rounds[0] - t_round)
        first_eval_extra = max(0.0, evals[0] - t_eval) if evals else 0.0
        return (startup + compile_extra + first_eval_extra + self.rounds * t_round
                + self.evaluations * t_eval)


# Set by `estimate_experiment`: train.py runs then become probes recorded here.
_PROBES: list[Probe] | None = None


def active_probes() -> list[Probe] | None:
    """The probes of the `estimate_experiment` under way (None when none is)."""
    return _PROBES


def _flag_value(args: Sequence[str], name: str) -> str | None:
    for a in args:
        if str(a).startswith(f"--{name}="):
            return str(a).split("=", 1)[1]
    return None


def _probe_args(args: Sequence[str]) -> tuple[list[str], int, int]:
    """train.py `args` as a probe (ESTIMATE_PROBE_ROUNDS rounds, two evaluations, no resume);
    also the real run's rounds and evaluations per algorithm."""
    rounds = int(_flag_value(args, "rounds") or 100)
    every = int(_flag_value(args, "eval_every") or 5)
    evaluations = (rounds // every + (rounds % every > 0)) if every else 1
    probe = ESTIMATE_PROBE_ROUNDS
    out = [a for a in map(str, args) if not a.startswith(("--rounds=", "--eval_every=",
                                                            "--resume"))]
    return out + [f"--rounds={probe}", f"--eval_every={probe // 2}"], rounds, evaluations


def run_subprocess(args: Sequence[str], what: str) -> None:
    """Runs `[python, *args]` in the repository root (its output goes to ours); stops it with
    SIGTERM (then SIGKILL) if we are stopped; raises `StepError` if it fails. Under
    `estimate_experiment`, a train.py run is replaced by its probe."""
    if _PROBES is not None and str(args[0]).endswith("train.py"):
        args, rounds, evaluations = _probe_args(args)
        started = time.perf_counter()
        _run_command(args, what)
        wall = time.perf_counter() - started
        run_dir = pathlib.Path(_flag_value(args, "output_dir"))
        for metrics in sorted(run_dir.rglob("metrics.csv")):
            rows = _read_csv(metrics)
            name = what if metrics.parent == run_dir else f"{what}: {metrics.parent.name}"
            share = wall / max(1, len(list(run_dir.rglob("metrics.csv"))))
            _PROBES.append(Probe(
                name, rounds, evaluations, share,
                [_float(r["round_seconds"]) for r in rows],
                [_float(r["evaluation_seconds"]) for r in rows
                 if not _missing(r.get("evaluation_seconds"))]))
        return
    _run_command(args, what)


_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Asks the Linux kernel to SIGTERM this child when its parent thread exits, even by
    SIGKILL (e.g. a `subprocess.run(timeout=...)` around reproduce.py), so a train.py run never
    outlives the experiment: its SIGTERM handler stops its TFF workers, and `--resume` restarts
    it from its last checkpoint (`tffl.runtime.workers` does the same for the workers, with
    SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Not Linux: the SIGTERM in `_run_command`'s `finally` still applies.


def _run_command(args: Sequence[str], what: str) -> None:
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


def _need_data(ctx: Context, relative: str) -> pathlib.Path:
    path = ctx.data_dir / relative
    if not path.exists():
        raise UsageError(f"flag --data_dir={ctx.data_dir}: {relative} not found there (the "
                         "real data ships beside the checkout as ../shared/data)")
    return path


def _read_csv(path: pathlib.Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _mean(values) -> float:
    values = [v for v in values if not _missing(v)]
    return sum(values) / len(values) if values else math.nan


def _std(values) -> float:
    """The sample standard deviation (ddof = 1) of the values that are not missing:
    s = √(Σ (v − v̄)² / (n − 1)); NaN for fewer than two.

    >>> _std([1.0, 2.0, 3.0]), _std([3.0, 1.0]), _std([5.0])
    (1.0, 1.4142135623730951, nan)
    """
    values = [v for v in values if not _missing(v)]
    if len(values) < 2:
        return math.nan
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _mean_std(values, spec="{:.3f}") -> str:
    """"mean ± s" with s the sample std (ddof = 1, `_std`); one value alone; "–" for none.

    >>> _mean_std([0.8, 0.9], "{:.4f}"), _mean_std([0.8]), _mean_std([None])
    ('0.8500 ± 0.0707', '0.800', '–')
    """
    values = [v for v in values if not _missing(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return spec.format(values[0])
    return f"{spec.format(_mean(values))} ± {spec.format(_std(values))}"



def estimate_experiment(ctx: Context, runner: Callable[[Context], Any]) -> float:
    """Runs the experiment with every train.py run replaced by a short timed probe (in
    <output_dir>/estimate) and prints each run's predicted time; returns the total (seconds).

    Raises:
      UsageError: the experiment runs in this process (no train.py runs to probe)."""
    import shutil

    global _PROBES
    # Probes never touch --archive_dir: they are neither finished runs nor ones to continue.
    probe_ctx = dataclasses.replace(ctx, output_dir=ctx.output_dir / "estimate", resume=False,
                                    archive_dir=None)
    shutil.rmtree(probe_ctx.output_dir, ignore_errors=True)
    _PROBES = []
    try:
        runner(probe_ctx)
        probes = list(_PROBES)
    finally:
        _PROBES = None
    if not probes:
        raise UsageError(f"flag --estimate: {ctx.experiment} runs in this process, without "
                         "train.py runs to probe; docs/REPRODUCE.md has its measured time")
    total = 0.0
    ctx.log(f"\n{ctx.experiment} ({ctx.scale} scale), predicted from {ESTIMATE_PROBE_ROUNDS}-round "
            "probes on this machine:")
    for p in probes:
        seconds = p.predicted_seconds()
        total += seconds
        ctx.log(f"  {p.what}: {p.rounds} rounds, {p.evaluations} evaluations: "
                f"{seconds / 60:.1f} min")
    ctx.log(f"  total: {total / 3600:.2f} h")
    return total
