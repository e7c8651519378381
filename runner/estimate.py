"""`reproduce.py --estimate`: an experiment's time predicted from short timed probes.

`estimate_experiment` runs the experiment with every training run (`running.run_training`)
replaced by a probe of ESTIMATE_PROBE_ROUNDS rounds evaluated twice (`probe_config`), in
<output_dir>/estimate, and prints each run's predicted time (`Probe.predicted_seconds`) and the
total. Runs already finished in --archive_dir (or, with --resume, in --output_dir) count 0; a run
stopped there counts only the rounds after its newest checkpoint, where --resume continues. The
experiments read those finished runs' summaries as the next invocation would, so the runs listed are the
ones an invocation would train (e.g. the seeds at the rate their grid chose). Nothing is written
outside <output_dir>/estimate.

>>> probe = Probe("run", rounds=100, evaluations=5, wall_seconds=20.0,
...               round_seconds=[5.0, 1.0, 1.0, 1.0], evaluation_seconds=[3.0, 2.0],
...               start_round=40, eval_every=20)
>>> probe.predicted_seconds()   # startup 7, compile 4, first evaluation 1, 60·1 + 3·2
78.0
>>> probe.describe()
'run: 60 of 100 rounds and 3 of 5 evaluations (resumes at round 40): 1.3 min'
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import time
from collections.abc import Callable
from typing import Any

from runner import archive
from runner.cli import UsageError
from runner.report import as_float, missing, read_csv
from runner.run_config import RunConfig

ESTIMATE_PROBE_ROUNDS = 4


@dataclasses.dataclass
class Probe:
    """One training run's probe: the rounds and evaluations the real run would do, and the
    probe's wall time, per-round and per-evaluation seconds; `start_round` where the real run
    resumes (its newest checkpoint) and `eval_every` its evaluation period; `finished` for a run
    already done (nothing probed, nothing left)."""

    what: str
    rounds: int
    evaluations: int
    wall_seconds: float
    round_seconds: list[float]
    evaluation_seconds: list[float]
    start_round: int = 0
    eval_every: int = 0
    finished: bool = False

    def predicted_seconds(self) -> float:
        """startup + first-round compile + R·t_round + E·t_eval, with t_round (t_eval) the mean
        of the probe's later rounds (evaluations), startup what the probe spent outside them,
        and R (E) the rounds (evaluations) after `start_round`; 0 for a finished run."""
        if self.finished:
            return 0.0
        rounds, evals = self.round_seconds, self.evaluation_seconds
        t_round = sum(rounds[1:]) / max(1, len(rounds) - 1) if len(rounds) > 1 else rounds[0]
        t_eval = (sum(evals[1:]) / (len(evals) - 1) if len(evals) > 1
                  else (evals[0] if evals else 0.0))
        startup = self.wall_seconds - sum(rounds) - sum(evals)
        compile_extra = max(0.0, rounds[0] - t_round)
        first_eval_extra = max(0.0, evals[0] - t_eval) if evals else 0.0
        return (startup + compile_extra + first_eval_extra
                + (self.rounds - self.start_round) * t_round
                + self.remaining_evaluations() * t_eval)

    def remaining_evaluations(self) -> int:
        """The evaluations after `start_round` (every `eval_every` rounds and at the end)."""
        return self.evaluations - (self.start_round // self.eval_every if self.eval_every else 0)

    def describe(self) -> str:
        """The run's line of the estimate."""
        if self.finished:
            return f"{self.what}: finished"
        left = (f"{self.rounds} rounds, {self.evaluations} evaluations" if not self.start_round
                else f"{self.rounds - self.start_round} of {self.rounds} rounds and "
                f"{self.remaining_evaluations()} of {self.evaluations} evaluations (resumes at "
                f"round {self.start_round})")
        return f"{self.what}: {left}: {self.predicted_seconds() / 60:.1f} min"


# Set by `estimate_experiment`: training runs then become probes recorded here.
_PROBES: list[Probe] | None = None
# Set by `estimate_experiment`: (the probes' output_dir, the folders of the real runs, read only).
_PROGRESS: tuple[pathlib.Path, tuple[pathlib.Path, ...]] | None = None


def active_probes() -> list[Probe] | None:
    """The probes of the `estimate_experiment` under way (None when none is)."""
    return _PROBES


def _locate(run_dir: pathlib.Path, rounds: int) -> tuple[pathlib.Path | None, int]:
    """`archive.progress` of the real run of the probe folder `run_dir` (none outside
    `estimate_experiment`)."""
    if _PROGRESS is None:
        return None, 0
    root, folders = _PROGRESS
    try:
        relative = pathlib.Path(run_dir).relative_to(root)
    except ValueError:
        return None, 0
    return archive.progress(folders, relative, rounds)


def estimate_progress(run_dir: pathlib.Path, rounds: int) -> tuple[dict | None, int]:
    """Under `estimate_experiment`, where the real run of the probe folder `run_dir` stands in
    --archive_dir and, with --resume, --output_dir: (its summary, rounds) if it finished there,
    its files then copied into `run_dir` as an invocation restores them (`archive.restore`), for
    the experiment to read; else (None, the round it resumes at); (None, 0) otherwise."""
    found, start_round = _locate(run_dir, rounds)
    if found is None:
        return None, start_round
    return archive.restore(found, pathlib.Path(run_dir), rounds), rounds


def probe_config(config: RunConfig) -> tuple[RunConfig, int, int]:
    """`config` as a probe (ESTIMATE_PROBE_ROUNDS rounds, two evaluations, no resume); also the
    real run's rounds and evaluations per algorithm.

    >>> probe, rounds, evaluations = probe_config(RunConfig().with_changes(rounds=150))
    >>> (probe.algorithm.rounds, probe.output.eval_every, rounds, evaluations)
    (4, 2, 150, 30)
    """
    rounds, every = config.algorithm.rounds, config.output.eval_every
    evaluations = (rounds // every + (rounds % every > 0)) if every else 1
    probe = ESTIMATE_PROBE_ROUNDS
    return (config.with_changes(rounds=probe, eval_every=probe // 2, resume=False), rounds,
            evaluations)


def probe_run(config: RunConfig, what: str, train: Callable[[RunConfig], None]) -> None:
    """Records the probe of the training run `config` (`train` runs a configuration): if every
    algorithm's folder (`runner.run.run_folders`) finished in the real folders, their files
    are copied (`estimate_progress`) and each gets a finished probe; else `probe_config(config)`
    is trained and timed, one `Probe` per metrics.csv it writes, finished (files copied) or
    counting from the round where that folder's run resumes."""
    from runner import run

    probe, rounds, evaluations = probe_config(config)
    run_dir = pathlib.Path(probe.output.output_dir)
    folders = [folder for _, folder in run.run_folders(probe)]

    def name(folder):
        return what if folder == run_dir else f"{what}: {folder.name}"

    if all(_locate(folder, rounds)[0] is not None for folder in folders):
        for folder in folders:
            estimate_progress(folder, rounds)
            _PROBES.append(Probe(name(folder), rounds, evaluations, 0.0, [], [], finished=True))
        return
    started = time.perf_counter()
    train(probe)
    wall = time.perf_counter() - started
    found = sorted(run_dir.rglob("metrics.csv"))
    for metrics in found:
        folder = metrics.parent
        if estimate_progress(folder, rounds)[0] is not None:
            _PROBES.append(Probe(name(folder), rounds, evaluations, 0.0, [], [], finished=True))
            continue
        rows = read_csv(metrics)
        _PROBES.append(Probe(
            name(folder), rounds, evaluations, wall / max(1, len(found)),
            [as_float(r["round_seconds"]) for r in rows],
            [as_float(r["evaluation_seconds"]) for r in rows
             if not missing(r.get("evaluation_seconds"))],
            start_round=_locate(folder, rounds)[1], eval_every=config.output.eval_every))


def estimate_experiment(ctx, runner: Callable[[Any], Any]) -> float:
    """Runs the experiment (`runner` of its `running.Context` `ctx`) with every training run
    (`running.run_training`) replaced by a short timed probe (in <output_dir>/estimate) and
    prints each run's predicted time; returns the total (seconds). A run finished in
    --archive_dir (or, with --resume, in --output_dir) counts 0 and is probed no more, one
    stopped there counts the rounds and evaluations after its newest checkpoint, and the
    experiment's choices read those finished runs as a real invocation would (e.g. the rate its
    seeds run at); nothing is written there.

    Raises:
      UsageError: the experiment has no training runs to probe."""
    global _PROBES, _PROGRESS
    # Probes never write to --archive_dir: they are neither finished runs nor ones to continue.
    probe_ctx = dataclasses.replace(ctx, output_dir=ctx.output_dir / "estimate", resume=False,
                                    archive_dir=None)
    shutil.rmtree(probe_ctx.output_dir, ignore_errors=True)
    real = tuple(d for d in (ctx.archive_dir, ctx.output_dir if ctx.resume else None) if d)
    _PROBES, _PROGRESS = [], (probe_ctx.output_dir, real)
    try:
        runner(probe_ctx)
        probes = list(_PROBES)
    finally:
        _PROBES, _PROGRESS = None, None
    if not probes:
        raise UsageError(f"flag --estimate: {ctx.experiment} has no training runs to probe; "
                         "docs/REPRODUCE.md has its measured time")
    total = sum(p.predicted_seconds() for p in probes)
    ctx.log(f"\n{ctx.experiment} ({ctx.scale} scale), predicted from {ESTIMATE_PROBE_ROUNDS}-round "
            "probes on this machine:")
    for p in probes:
        ctx.log(f"  {p.describe()}")
    finished = sum(p.finished for p in probes)
    where = " and ".join(str(d) for d in real)
    done = f"; {finished} of {len(probes)} runs finished in {where}" if real else ""
    ctx.log(f"  total: {total / 3600:.2f} h{done}")
    return total
