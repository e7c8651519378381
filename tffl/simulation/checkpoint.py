"""Atomic, resumable checkpoints of a process's server state (and any extra arrays).

A checkpoint for round `t` is one directory `round_00000t/` holding

- `state.npz`: the leaves of `tf.nest.flatten(state)` as arrays `leaf_00000`, `leaf_00001`, ...;
- `extra.npz`: optional named arrays (e.g. the personal-state store of stateful clients);
- `meta.json`: round number, number and shapes of leaves, the run's configuration and the
  fingerprint of the frozen weights the state was trained against (`tffl.engine.frozen`).

It is written to a temporary directory and renamed into place, so an interruption never leaves a
half-written checkpoint that looks complete. Loading needs a *template* state of the same structure
(for example `process.initialize()`): leaves are checked against it one by one, and any mismatch
(another model, another rank, another algorithm) raises `CheckpointMismatchError` naming the leaf.

Example:

>>> with runtime.local_runtime():
...     state = process.initialize()
>>> _ = save(run_dir / "checkpoints", round_num=3, state=state, config={"seed": 1})
>>> round_num, path = latest(run_dir / "checkpoints")
>>> round_num, path.name
(3, 'round_000003')
>>> restored, extra, meta = load(path, template=state)
>>> meta["round"], meta["config"], extra
(3, {'seed': 1}, {})
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

_PREFIX = "round_"


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the state structure or configuration it is loaded into."""


def _dir_name(round_num: int) -> str:
    return f"{_PREFIX}{round_num:06d}"


def _to_array(leaf: Any) -> np.ndarray:
    if isinstance(leaf, tf.Tensor | tf.Variable):
        leaf = leaf.numpy()
    return np.asarray(leaf)


def save(
    root: os.PathLike | str,
    round_num: int,
    state: Any,
    config: dict | None = None,
    extra: dict[str, np.ndarray] | None = None,
    keep: int = 2,
    frozen_fingerprint: str | None = None,
) -> pathlib.Path:
    """Writes the checkpoint of `round_num` under `root` and keeps only the newest `keep`.

    `frozen_fingerprint`: the `tffl.engine.frozen` fingerprint of the weights the state does not hold
    (the frozen backbone), stored in `meta.json` so a resume can check it."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    leaves = [_to_array(leaf) for leaf in tf.nest.flatten(state)]
    meta = {
        "round": int(round_num),
        "num_leaves": len(leaves),
        "shapes": [list(leaf.shape) for leaf in leaves],
        "dtypes": [str(leaf.dtype) for leaf in leaves],
        "config": config or {},
        "frozen_fingerprint": frozen_fingerprint,
    }
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp_", dir=root))
    try:
        np.savez(tmp / "state.npz", **{f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)})
        np.savez(tmp / "extra.npz", **(extra or {}))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        final = root / _dir_name(round_num)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_rounds(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(root / _dir_name(old), ignore_errors=True)
    return final


def list_rounds(root: os.PathLike | str) -> list[int]:
    """Rounds with a complete checkpoint under `root`, ascending."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    rounds = []
    for child in root.iterdir():
        if child.name.startswith(_PREFIX) and (child / "meta.json").is_file():
            try:
                rounds.append(int(child.name[len(_PREFIX) :]))
            except ValueError:
                continue
    return sorted(rounds)


def latest(root: os.PathLike | str) -> tuple[int, pathlib.Path] | None:
    """`(round, path)` of the newest complete checkpoint under `root`, or `None`."""
    rounds = list_rounds(root)
    if not rounds:
        return None
    return rounds[-1], pathlib.Path(root) / _dir_name(rounds[-1])


def load(
    path: os.PathLike | str, template: Any
) -> tuple[Any, dict[str, np.ndarray], dict]:
    """Loads the checkpoint at `path` into the structure of `template`.

    Returns:
      `(state, extra, meta)`: the state with `template`'s structure and dtypes, the extra arrays,
      and the metadata (including `meta["round"]` and `meta["config"]`).
    """
    path = pathlib.Path(path)
    meta = json.loads((path / "meta.json").read_text())
    template_leaves = tf.nest.flatten(template)
    if meta["num_leaves"] != len(template_leaves):
        raise CheckpointMismatchError(
            f"checkpoint {path} holds {meta['num_leaves']} state tensors but this process's state "
            f"has {len(template_leaves)}: it was written by another algorithm or model. "
            "Use a fresh --output_dir or the original configuration."
        )
    with np.load(path / "state.npz") as arrays:
        leaves = [arrays[f"leaf_{i:05d}"] for i in range(len(template_leaves))]
    restored = []
    for i, (leaf, ref) in enumerate(zip(leaves, template_leaves)):
        ref = _to_array(ref)
        if leaf.shape != ref.shape:
            raise CheckpointMismatchError(
                f"checkpoint {path}: state tensor {i} has shape {leaf.shape}, this process "
                f"expects {ref.shape}. Use a fresh --output_dir or the original configuration."
            )
        restored.append(leaf.astype(ref.dtype) if ref.dtype != object else leaf)
    with np.load(path / "extra.npz") as arrays:
        extra = {key: arrays[key] for key in arrays.files}
    return tf.nest.pack_sequence_as(template, restored), extra, meta
