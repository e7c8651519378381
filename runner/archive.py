"""Finished training runs that outlive a checkout: `reproduce.py --archive_dir`.

The multi-day experiments (sst2_clients, sst2_dirichlet, reviews_domains) run over several invocations, and
`runs/` is not committed. The archive keeps, in `--output_dir`'s layout, what a run needs to be
tabulated or continued elsewhere:

- a finished run (its `summary.json` says every round was completed): `summary.json`,
  `metrics.csv` and `legs.jsonl` (`runner.machine`), a few KiB;
- a run that an invocation stopped: `metrics.csv`, `legs.jsonl` and its newest complete checkpoint
  (`checkpoints/round_<n>/`, tffl.simulation.checkpoint's layout: the federated variables only, about
  100 KiB for LoRA on MiniLM), dropped once the run finishes.

`train_once` is the one way these experiments run a training run
(`runner.running.run_training`):

>>> import json, pathlib
>>> out, kept = run_dir / "archive_example" / "out", run_dir / "archive_example" / "kept"
>>> def train(resume):   # stands in for the training run
...     (out / "r").mkdir(parents=True)
...     (out / "r" / "summary.json").write_text(json.dumps({"rounds_completed": 5}))
...     (out / "r" / "metrics.csv").write_text("round\\n5\\n")
>>> train_once(out / "r", 5, train, out, kept)
{'rounds_completed': 5}
>>> sorted(p.name for p in (kept / "r").iterdir())
['metrics.csv', 'summary.json']
>>> train_once(out.parent / "fresh" / "r", 5, None, out.parent / "fresh", kept)  # not run again
{'rounds_completed': 5}
"""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable

from runner import machine
from runner.run_config import EVALUATION_FLAGS
from tffl.simulation.predictions import PREDICTIONS_FILE

KEPT_FILES = ("summary.json", "metrics.csv", machine.LEGS_FILE, PREDICTIONS_FILE)
CHECKPOINTS = "checkpoints"
RERUN = "rerun"   # summary.json's record of a rerun (`attach_rerun`)
RERUN_METRICS = "metrics_rerun.csv"


def finished_summary(run_dir: pathlib.Path, rounds: int) -> dict | None:
    """The run's summary.json if it completed all `rounds` rounds, else None.

    Raises:
      ValueError: naming the file, if it is not a JSON object (a damaged archive or run)."""
    summary = read_summary(run_dir)
    return summary if summary is not None and summary.get("rounds_completed") == rounds else None


def read_summary(run_dir: pathlib.Path) -> dict | None:
    """The run's summary.json as a dict; None if there is none.

    Raises:
      ValueError: naming the file, if it is not a JSON object (a damaged archive or run)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a train.py summary ({e}); delete it to run that run "
                         "again") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a train.py summary (no JSON object); delete it to run "
                         "that run again")
    return summary


def newest_checkpoint(run_dir: pathlib.Path) -> pathlib.Path | None:
    """The newest complete `checkpoints/round_<000n>` of a run (one with its meta.json)."""
    done = [c for c in (run_dir / CHECKPOINTS).glob("round_*") if (c / "meta.json").is_file()]
    return max(done, key=lambda c: c.name) if done else None


def progress(folders, relative: pathlib.Path, rounds: int) -> tuple[pathlib.Path | None, int]:
    """Where a run stands in `folders` (each in --output_dir's layout, in the order an
    invocation reads them: the archive, then the run folder, whose own checkpoints an invocation resumes from
    over the archive's, `restore`), read only: (the run's folder in the one where it finished,
    `rounds`) if it finished in one of them, else (None, the round of the newest complete
    checkpoint of the last one that has one, 0 if none), where --resume would continue.

    >>> run = run_dir / "progress_example" / "lr0.1"
    >>> (run / "checkpoints" / "round_000040").mkdir(parents=True)
    >>> (run / "checkpoints" / "round_000040" / "meta.json").write_text("{}")
    2
    >>> progress([run.parent], pathlib.Path("lr0.1"), 100), progress([], pathlib.Path("x"), 9)
    ((None, 40), (None, 0))
    """
    start = 0
    for folder in folders:
        if finished_summary(folder / relative, rounds) is not None:
            return folder / relative, rounds
        newest = newest_checkpoint(folder / relative)
        if newest is not None:
            number = newest.name.removeprefix("round_")
            if not number.isdigit():
                raise ValueError(f"{newest}: not a checkpoint folder (round_<number>); move it "
                                 "out of the run's checkpoints/")
            start = int(number)
    return None, start


def restore(archived: pathlib.Path, run_dir: pathlib.Path, rounds: int) -> dict | None:
    """Copies a run's files from its `archived` folder into `run_dir`: a finished run's files,
    or a stopped run's newest checkpoint and metrics when `run_dir` has no checkpoint of its
    own. Returns the summary of a finished run, else None."""
    if finished_summary(archived, rounds) is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in KEPT_FILES:
            if (archived / name).exists():
                shutil.copyfile(archived / name, run_dir / name)
        return finished_summary(run_dir, rounds)
    newest = newest_checkpoint(archived)
    if newest is not None and newest_checkpoint(run_dir) is None:
        shutil.copytree(newest, run_dir / CHECKPOINTS / newest.name, dirs_exist_ok=True)
        for name in ("metrics.csv", machine.LEGS_FILE):
            if (archived / name).exists():
                shutil.copyfile(archived / name, run_dir / name)
    return None


def keep(run_dir: pathlib.Path, rounds: int, archived: pathlib.Path) -> None:
    """Copies a run's `KEPT_FILES` to `archived`; for a stopped run also its newest checkpoint,
    replacing an older archived one; a finished run's archived checkpoint is removed. A finished
    run whose archived summary.json is as new as `run_dir`'s or newer (e.g. one re-evaluated
    with train.py --evaluate_only since `run_dir` was written) is left as archived."""
    finished = finished_summary(run_dir, rounds) is not None
    newest = None if finished else newest_checkpoint(run_dir)
    if not finished and newest is None:
        return
    if finished and finished_summary(archived, rounds) is not None and (
            (archived / "summary.json").stat().st_mtime
            >= (run_dir / "summary.json").stat().st_mtime):
        return
    archived.mkdir(parents=True, exist_ok=True)
    for name in KEPT_FILES:
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, archived / name)
    if (archived / CHECKPOINTS).exists():
        shutil.rmtree(archived / CHECKPOINTS)
    if newest is not None:
        shutil.copytree(newest, archived / CHECKPOINTS / newest.name)


def _newer(archived: pathlib.Path, run_dir: pathlib.Path, rounds: int) -> bool:
    """Whether `archived` holds a finished run's summary.json written after `run_dir`'s."""
    return finished_summary(archived, rounds) is not None and (
        (archived / "summary.json").stat().st_mtime
        > (run_dir / "summary.json").stat().st_mtime)


def train_once(run_dir: pathlib.Path, rounds: int, train: Callable[[bool], None] | None,
               output_dir: pathlib.Path, archive: pathlib.Path | None) -> dict | None:
    """The summary of the run in `run_dir` (under `output_dir`), training it only if needed.

    Found finished in `run_dir` or in `archive` (same relative path): not run again; the newer
    of the two summaries is the run's (the archive's is copied into `run_dir`, e.g. one
    re-evaluated elsewhere since `run_dir` was written). Else, if
    `train` is given (not with --collect), `train(resume)` runs it, `resume` saying whether
    `run_dir` holds checkpoints (its own, or restored from `archive`) to continue from; stopped
    or failed, its newest checkpoint still goes to `archive`. None if it is not finished."""
    archived = None if archive is None else archive / run_dir.relative_to(output_dir)
    summary = finished_summary(run_dir, rounds)
    if archived is not None and (summary is None or _newer(archived, run_dir, rounds)):
        summary = restore(archived, run_dir, rounds) or summary
    if summary is None and train is not None:
        try:
            train((run_dir / CHECKPOINTS).exists())
        finally:
            if archived is not None:
                keep(run_dir, rounds, archived)
        return finished_summary(run_dir, rounds)
    if summary is not None and archived is not None:
        keep(run_dir, rounds, archived)
    return summary


def attach_rerun(run_dir: pathlib.Path, rerun_dir: pathlib.Path) -> dict:
    """Records in a finished run's summary.json a rerun of it, for metrics the run lacks.

    A run that kept no checkpoint cannot be re-evaluated (train.py --evaluate_only), e.g. for
    FedSA-LoRA's personalized test accuracy, added after it ran: it is run again with the same
    flags (seed included) in `rerun_dir`. The run's own figures stay as they are; its summary
    gets `rerun` = {"final": the rerun's final metrics, "wall_seconds_this_run",
    "max_abs_difference_of_shared_metrics": max |final[k] − rerun final[k]| over the numeric
    metrics both hold}, and the rerun's metrics.csv is kept beside as `metrics_rerun.csv`.
    A rerun on another machine agrees to float rounding, not always bit for bit (FedSA-LoRA's
    SST-2 reruns, three days after their runs: training losses apart by ~1e-7 from round 2,
    final dev accuracies by up to a few sentences; `runner.machine`), so the difference is
    recorded rather than required to be 0, with the rerun's `machine` beside it.
    `experiments.sst2_protocol.claim_accuracy` takes a figure from `rerun` only when the run's own
    final lacks it.

    Returns the updated summary.

    The rerun may evaluate more than the run did (`runner.run_config.EVALUATION_FLAGS`, e.g.
    --eval_test for a held-out split added later); every other flag must be the run's.

    Raises:
      ValueError: naming the folder, if either run is not finished, they ran a different number
        of rounds, or their flags other than the evaluation flags differ (naming them).
    """
    summaries = []
    for folder in (run_dir, rerun_dir):
        summary = read_summary(folder)
        done = None if summary is None else summary.get("rounds_completed")
        if done is None or not isinstance(summary.get("final"), dict) or (
                done != summary.get("flags", {}).get("rounds", done)):
            raise ValueError(f"{folder}: no finished train.py run (summary.json with its final "
                             "metrics after all --rounds); finish it first")
        summaries.append(summary)
    run, rerun = summaries
    if run["rounds_completed"] != rerun["rounds_completed"]:
        raise ValueError(f"{rerun_dir}: ran {rerun['rounds_completed']} rounds, {run_dir} "
                         f"{run['rounds_completed']}; rerun with the run's flags")
    flags, again = run.get("flags", {}), rerun.get("flags", {})
    differ = sorted(k for k in set(flags) | set(again)
                    if flags.get(k) != again.get(k) and k not in EVALUATION_FLAGS)
    if differ:
        raise ValueError(f"{rerun_dir}: flags differ from {run_dir}'s ({', '.join(differ)}); "
                         "rerun with the run's flags")
    shared = [k for k in run["final"] if k in rerun["final"]
              and isinstance(run["final"][k], (int, float))]
    run[RERUN] = {
        "final": rerun["final"],
        "wall_seconds_this_run": rerun.get("wall_seconds_this_run"),
        "machine": rerun.get("machine"),
        "max_abs_difference_of_shared_metrics": max(
            (abs(run["final"][k] - rerun["final"][k]) for k in shared), default=None)}
    (run_dir / "summary.json").write_text(json.dumps(run, indent=1, sort_keys=True))
    if (rerun_dir / "metrics.csv").exists():
        shutil.copyfile(rerun_dir / "metrics.csv", run_dir / RERUN_METRICS)
    return run
