"""Atomic, resumable checkpoints of a process's server state (and any extra arrays).

A checkpoint for round `t` is one directory `round_00000t/` holding

- `state.npz`: the leaves of `tf.nest.flatten(state)`, each array named by what it holds: its path
  in the state's structure (`finalizer/steps/b_round/accumulator/0`), and for the model's weights
  the Keras variable's name in place of the position when `variable_names` are given
  (`global_model_weights/trainable/transformer_layer_3_query_lora/lora_a`; `variable_names(process)`
  reads them off a Keras algorithm's process);
- `extra.npz`: optional named arrays (e.g. the personal-state store of stateful clients);
- `meta.json`: round number, the leaves' names (`names`, in flatten order), paths, shapes and
  dtypes, the run's configuration and the fingerprint of the frozen weights the state was trained
  against (`tffl.engine.frozen`).

A checkpoint is written to a temporary directory and renamed into place, so
an interruption never leaves a half-written checkpoint that looks complete. Loading needs a
*template* state of the same structure (for example `process.initialize()`) and restores by
position: leaves are checked against it one by one, and any mismatch (another model, another
rank, another algorithm: a different count, path, variable name or shape) raises
`CheckpointMismatchError` naming the variable.

Example:

>>> with runtime.local_runtime():
...     state = process.initialize()
>>> names = variable_names(process)
>>> _ = save(run_dir / "checkpoints", round_num=3, state=state, config={"seed": 1},
...          variable_names=names)
>>> round_num, path = latest(run_dir / "checkpoints")
>>> round_num, path.name
(3, 'round_000003')
>>> restored, extra, meta = load(path, template=state, variable_names=names)
>>> meta["round"], meta["config"], extra, meta["names"][0]
(3, {'seed': 1}, {}, 'global_model_weights/trainable/lora/lora_a')
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

_PREFIX = "round_"
# The structure paths whose positions `variable_names` names (ModelWeights of a Keras process).
MODEL_WEIGHTS = ("global_model_weights/trainable", "global_model_weights/non_trainable")


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the state structure or configuration it is loaded into."""


def _dir_name(round_num: int) -> str:
    return f"{_PREFIX}{round_num:06d}"


def _to_array(leaf: Any) -> np.ndarray:
    if isinstance(leaf, tf.Tensor | tf.Variable):
        leaf = leaf.numpy()
    return np.asarray(leaf)


def variable_names(process: Any) -> dict[str, list[str]] | None:
    """{structure path: Keras variable names, by position} of the model weights in the server
    state of a Keras algorithm's `tffl.engine.process.Process` (its `FederatedModel`'s federated
    variables, in `global_model_weights`' order); None for a process without a Keras model
    (linear algorithms, TFF's own processes).

    >>> variable_names(process)              # RoLoRA on a `lora` layer and a `head`
    {'global_model_weights/trainable': ['lora/lora_a', 'lora/lora_b', 'head/kernel', \
'head/bias'], 'global_model_weights/non_trainable': []}
    """
    model = getattr(process, "model", None)
    layout = getattr(model, "layout", None)
    if layout is None:
        return None
    spec = layout.spec
    return {
        MODEL_WEIGHTS[0]: [_clean(spec.trainable[k].name) for k in layout.trainable],
        MODEL_WEIGHTS[1]: [_clean(spec.non_trainable[k].name) for k in layout.non_trainable],
    }


def _clean(name: str) -> str:
    """A TF variable name without its output index (`dense/kernel:0` -> `dense/kernel`)."""
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def _paths(state: Any) -> list[str]:
    """The structure path of every leaf of `tf.nest.flatten(state)`, in that order."""
    flat_paths = getattr(getattr(tf, "__internal__", None), "nest", None)
    flat_paths = getattr(flat_paths, "yield_flat_paths", None)
    count = len(tf.nest.flatten(state))
    if flat_paths is None:
        return [str(i) for i in range(count)]
    paths = ["/".join(str(p) for p in path) for path in flat_paths(state)]
    if len(paths) != count:   # never seen; positions then
        return [str(i) for i in range(count)]
    return [p or "state" for p in paths]


def leaf_names(state: Any, variable_names: Mapping[str, Sequence[str]] | None = None
               ) -> tuple[list[str], list[str]]:
    """`(names, paths)` of `tf.nest.flatten(state)`'s leaves: the structure paths, and the names
    `save` stores them under, where the position in a list `variable_names` covers is replaced by
    the variable's name (kept beside the position if that name is not unique).

    >>> import collections
    >>> leaf_names(collections.OrderedDict(w=[1.0, 2.0], n=3), {"w": ["dense/kernel", "dense/bias"]})
    (['n', 'w/dense/kernel', 'w/dense/bias'], ['n', 'w/0', 'w/1'])
    """
    paths = _paths(state)
    names, full = list(paths), list(paths)
    for prefix, vars_ in (variable_names or {}).items():
        for i, path in enumerate(paths):
            head, _, position = path.rpartition("/")
            if head == prefix and position.isdigit() and int(position) < len(vars_):
                names[i] = f"{prefix}/{vars_[int(position)]}"
                full[i] = f"{path}/{vars_[int(position)]}"
    names = [f if names.count(n) > 1 else n for n, f in zip(names, full)]
    if len(set(names)) != len(names):   # a variable's name equal to another leaf's path
        names = list(paths)
    return names, paths


def save(
    root: os.PathLike | str,
    round_num: int,
    state: Any,
    config: dict | None = None,
    extra: dict[str, np.ndarray] | None = None,
    keep: int = 2,
    frozen_fingerprint: str | None = None,
    variable_names: Mapping[str, Sequence[str]] | None = None,
) -> pathlib.Path:
    """Writes the checkpoint of `round_num` under `root` and keeps only the newest `keep`.

    `frozen_fingerprint`: the `tffl.engine.frozen` fingerprint of the weights the state does not hold
    (the frozen backbone), stored in `meta.json` so a resume can check it. `variable_names`:
    {structure path: names by position} (`variable_names(process)`), for the arrays' names."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    leaves = [_to_array(leaf) for leaf in tf.nest.flatten(state)]
    names, paths = leaf_names(state, variable_names)
    meta = {
        "round": int(round_num),
        "num_leaves": len(leaves),
        "names": names,
        "paths": paths,
        "shapes": [list(leaf.shape) for leaf in leaves],
        "dtypes": [str(leaf.dtype) for leaf in leaves],
        "config": config or {},
        "frozen_fingerprint": frozen_fingerprint,
    }
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp_", dir=root))
    try:
        np.savez(tmp / "state.npz", **dict(zip(names, leaves)))
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


_FIX = "Use a fresh --output_dir or the original configuration."


def _stored_names(path: pathlib.Path, meta: dict, template: Any,
                  variable_names: Mapping[str, Sequence[str]] | None) -> list[str]:
    """The array names of the template's leaves in the checkpoint at `path`, in order: the
    saved names, after checking their paths (and variable names, when both sides have them)
    against the template's."""
    if "names" not in meta or "paths" not in meta:
        raise CheckpointMismatchError(
            f"checkpoint {path} does not name its arrays (written by an earlier tffl): it cannot "
            f"be checked against this process. Use a fresh --output_dir.")
    names, paths = leaf_names(template, variable_names)
    saved_names, saved_paths = meta["names"], meta["paths"]
    for i, (name, saved, saved_name) in enumerate(zip(names, saved_paths, saved_names)):
        named_both = variable_names is not None and saved_name != saved and name != paths[i]
        if saved != paths[i] or (named_both and saved_name != name):
            raise CheckpointMismatchError(
                f"checkpoint {path}: state tensor {i} is {saved_name} there but {name} in "
                f"this process (another algorithm, model or LoRA targets?). {_FIX}")
    return saved_names


def load(
    path: os.PathLike | str, template: Any,
    variable_names: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Any, dict[str, np.ndarray], dict]:
    """Loads the checkpoint at `path` into the structure of `template`, by position.

    `variable_names` (`variable_names(process)`, as given to `save`) also checks the saved
    variable names against the template's; the structure paths are checked either way.

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
            f"has {len(template_leaves)}: it was written by another algorithm or model. {_FIX}"
        )
    names = _stored_names(path, meta, template, variable_names)
    with np.load(path / "state.npz") as arrays:
        leaves = [arrays[name] for name in names]
    restored = []
    for i, (leaf, ref, name) in enumerate(zip(leaves, template_leaves, names)):
        ref = _to_array(ref)
        if leaf.shape != ref.shape:
            raise CheckpointMismatchError(
                f"checkpoint {path}: {name} (state tensor {i}) has shape {leaf.shape}, this process "
                f"expects {ref.shape}. {_FIX}"
            )
        restored.append(leaf.astype(ref.dtype) if ref.dtype != object else leaf)
    with np.load(path / "extra.npz") as arrays:
        extra = {key: arrays[key] for key in arrays.files}
    return tf.nest.pack_sequence_as(template, restored), extra, meta
