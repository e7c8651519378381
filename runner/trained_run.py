"""A training run's folder -> the Keras model its newest checkpoint holds.

`scripts/train.py` writes each algorithm's run into a folder: `config.json` (the run's
`RunConfig`), `checkpoints/round_xxxxxx/` (`tffl.simulation.checkpoint`: the server state, and
in `meta.json` the round, the run's identity and the fingerprint of the frozen weights) and
`summary.json`. A comparison of several algorithms writes one such folder per algorithm under
its output folder.

`trained_model(run_dir)` rebuilds the run's model from that folder exactly as the run built it:
the `RunConfig` (`run_config`: config.json, or the identity the checkpoint recorded for runs from
before it) -> the task and the algorithm's process (`runner.training.run_task_for`,
`build_run_process`, after the same random seed, so a random test backbone is drawn again as it was;
the frozen weights' fingerprint proves it) -> the newest checkpoint loaded into the process's
state -> `process.model_weights(state)` assigned to a fresh `task.keras_model_fn()`. For an
instruction task the model is `models.causal_lm.build_causal_lm`'s (its backbone:
`models.causal_lm.backbone_of`) and `task.decoder` its tokenizer.

`newest_checkpoint(run_dir)` finds the checkpoint without building anything, so that a caller
can refuse a run (by its recorded task, say) in a second. Every problem is a one-line
`ValueError` starting `run_dir=<folder>:`. Example (a folder that is no run):

>>> newest_checkpoint(run_dir / "nothing_here")
Traceback (most recent call last):
...
ValueError: run_dir=...nothing_here: no such folder
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

from runner import run
from runner.run_config import RunConfig


class TrainedRun(NamedTuple):
    """A run rebuilt from its folder: the Keras model holding its newest checkpoint's weights,
    that checkpoint's `meta.json` (round, recorded identity under "config"), the run's
    `RunConfig` and its task (`tasks.run_task.RunTask`)."""

    model: Any
    meta: dict
    config: RunConfig
    task: Any


def run_config(run_dir: pathlib.Path, recorded: dict, data_dir: str | None = None,
               frozen_dir: str | None = None) -> RunConfig:
    """The `RunConfig` of the run in `run_dir`: its config.json (runs since it exists), else the
    identity its checkpoint recorded (`recorded`: `runner.training.run_identity`) over the
    defaults; `data_dir` and `frozen_dir`, when given, replace the recorded ones. The global
    model carries the recorded (largest) rank: no client ranks."""
    from runner.run_config import SECTION_OF

    if (pathlib.Path(run_dir) / run.CONFIG_FILE).is_file():
        config = run.read_config(run_dir)
    else:
        config = RunConfig().with_changes(**{
            k: v for k, v in recorded.items()
            if k in SECTION_OF and k != "algorithm" and v is not None})
        config = config.with_changes(algorithm=[recorded["algorithm"]])
    changes = {"rank": config.model.adapter_rank, "client_ranks": None}
    if data_dir is not None:
        changes["data_dir"] = str(data_dir)
    if frozen_dir is not None:
        changes["frozen_dir"] = str(frozen_dir)
    return config.with_changes(**changes)


def _algorithm_folders(run_dir: pathlib.Path, checkpoints: str) -> list[pathlib.Path]:
    """The sub-folders of `run_dir` that are runs (a comparison's per-algorithm folders)."""
    return sorted(p for p in run_dir.iterdir() if p.is_dir() and (
        (p / checkpoints).is_dir() or (p / run.CONFIG_FILE).is_file()))


def newest_checkpoint(run_dir: str | pathlib.Path) -> tuple[pathlib.Path, dict]:
    """`(folder, meta)` of the newest complete checkpoint of the run in `run_dir`: its folder
    (`checkpoints/round_xxxxxx/`) and its `meta.json`.

    Raises:
      ValueError: one line starting `run_dir=<run_dir>:` when the folder does not exist, is the
        output folder of a comparison of several algorithms (naming the run folders to choose
        from), or holds no checkpoint.
    """
    from tffl.simulation import checkpoint
    from tffl.simulation.driver import CHECKPOINT_DIR

    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir={run_dir}: no such folder")
    found = checkpoint.latest(run_dir / CHECKPOINT_DIR)
    if found is None:
        runs = ([] if (run_dir / CHECKPOINT_DIR).is_dir()
                else _algorithm_folders(run_dir, CHECKPOINT_DIR))
        if runs:
            raise ValueError(f"run_dir={run_dir}: the output folder of a comparison of "
                             f"{len(runs)} runs; pass one of their folders: "
                             f"{', '.join(str(p) for p in runs)}")
        raise ValueError(f"run_dir={run_dir}: no checkpoint under {CHECKPOINT_DIR}/")
    return found[1], json.loads((found[1] / "meta.json").read_text())


def trained_model(run_dir: str | pathlib.Path, data_dir: str | None = None,
                  frozen_dir: str | None = None,
                  check: Callable[[dict], None] | None = None) -> TrainedRun:
    """The run in `run_dir` rebuilt with its newest checkpoint's weights (module docstring).

    Args:
      run_dir: a run's folder (one algorithm's: `--output_dir`, or its `<algorithm>/`).
      data_dir, frozen_dir: replace the recorded `data_dir` / `frozen_dir` (runs from before
        config.json did not record them).
      check: called with the checkpoint's recorded identity (`meta["config"]`: task, backbone,
        algorithm, ...) before anything is built; raises `ValueError` to refuse the run.

    Raises:
      ValueError: one line, from `newest_checkpoint`, from `check`, or when the rebuilt model's
        frozen weights are not the run's (pass its --data_dir / --frozen_dir).
    """
    from tffl.runtime import distribute
    from tffl.simulation import checkpoint

    run_dir = pathlib.Path(run_dir)
    folder, meta = newest_checkpoint(run_dir)
    recorded = meta["config"]
    if check is not None:
        check(recorded)
    summary = run_dir / "summary.json"
    if summary.is_file() and "rounds" in json.loads(summary.read_text()).get("flags", {}):
        recorded = recorded | {"rounds": json.loads(summary.read_text())["flags"]["rounds"]}
    config = run_config(run_dir, recorded, data_dir, frozen_dir)
    import tensorflow as tf

    from runner import training

    # As runner.training.run_algorithm: the same seed before the same builds draws the same
    # random (tiny) backbone; the fingerprint check below proves it.
    tf.keras.utils.set_random_seed(config.algorithm.seed)
    with distribute.distribute_runtime():
        task = training.run_task_for(recorded["algorithm"], config)
        process = training.build_run_process(recorded["algorithm"], task, config)
        if process.frozen_fingerprint != meta.get("frozen_fingerprint"):
            raise ValueError(
                f"run_dir={run_dir}: the rebuilt model's frozen weights (fingerprint "
                f"{process.frozen_fingerprint}) are not the run's ({meta.get('frozen_fingerprint')})"
                "; pass the run's --data_dir / --frozen_dir")
        state, _, _ = checkpoint.load(folder, template=process.initialize())
        weights = process.model_weights(state)
    model = task.keras_model_fn()
    weights.assign_weights_to(model)
    return TrainedRun(model, meta, config, task)
