"""Comparison plots of runs: test accuracy against communication rounds and against the bytes one
client has uploaded, the picture federated-LoRA methods are compared by.

A run is its metrics rows (`tffl.simulation.metrics_log.read_metrics`), or one list of rows per seed.
The accuracy is `eval_accuracy` (a global model) or, for personalized runs,
`eval_personal_accuracy`; the upload after round t is Σ_{s≤t} `bytes_up_per_client`(s). A run of
several seeds is drawn as their mean with a band from the lowest to the highest seed
(`seed_band`, over the rounds every seed evaluated). `plot_data` is what the PNG shows: lines and
markers, the bands, a dashed chance line at 1/classes, integer round ticks from 0 and an accuracy
axis of [0, 1], so that a short run (a few rounds, accuracies close together) still reads right.

Example:

>>> curves = accuracy_curves([
...     {"round": 1, "communication_rounds": 1, "bytes_up_per_client": 100.0},
...     {"round": 2, "communication_rounds": 2, "bytes_up_per_client": 50.0, "eval_accuracy": 0.5}])
>>> curves.communication_rounds, curves.uploaded_bytes, curves.accuracy
([2], [150.0], [0.5])
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ACCURACY_KEYS = ("eval_accuracy", "eval_personal_accuracy")
# Markers of runs with fewer than `FEW_POINTS` evaluations each: distinct, hollow and of
# decreasing size, so that runs at the same point do not hide one another.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
FEW_POINTS = 3


@dataclasses.dataclass(frozen=True)
class Curves:
    """One run's evaluated rounds: communication rounds done, cumulative upload per client
    (bytes) and accuracy, aligned; `metric` names the accuracy column used. For several seeds
    (`seed_band`): their means, with `low` / `high` the lowest and highest seed's accuracy and
    `seeds` how many."""

    metric: str
    communication_rounds: list[int]
    uploaded_bytes: list[float]
    accuracy: list[float]
    low: list[float] | None = None
    high: list[float] | None = None
    seeds: int = 1


def _present(value: Any) -> bool:
    return value is not None and value != "" and not (isinstance(value, float)
                                                      and math.isnan(value))


def accuracy_curves(rows: Sequence[Mapping[str, Any]]) -> Curves:
    """The curves of one run's metrics rows (see the module docstring)."""
    metric = next((k for k in ACCURACY_KEYS if any(_present(r.get(k)) for r in rows)),
                  ACCURACY_KEYS[0])
    uploaded, out = 0.0, Curves(metric, [], [], [])
    for r in rows:
        if _present(r.get("bytes_up_per_client")):
            uploaded += float(r["bytes_up_per_client"])
        if _present(r.get(metric)):
            out.communication_rounds.append(int(r.get("communication_rounds", r["round"])))
            out.uploaded_bytes.append(uploaded)
            out.accuracy.append(float(r[metric]))
    return out


def seed_band(runs: Sequence[Sequence[Mapping[str, Any]]]) -> Curves:
    """The curves of one setting run with several seeds (one list of metrics rows each): at
    every communication round all of them evaluated, the mean accuracy and upload, and the
    lowest and highest seed's accuracy (`low`, `high`).

    >>> band = seed_band([[{"round": 1, "eval_accuracy": 0.5}, {"round": 2, "eval_accuracy": 0.7}],
    ...                   [{"round": 1, "eval_accuracy": 0.6}]])
    >>> band.communication_rounds, band.accuracy, band.low, band.high, band.seeds
    ([1], [0.55], [0.5], [0.6], 2)
    """
    each = [accuracy_curves(rows) for rows in runs]
    common = sorted(set.intersection(*(set(c.communication_rounds) for c in each)))
    at = [[dict(zip(c.communication_rounds, zip(c.uploaded_bytes, c.accuracy)))[t]
           for c in each] for t in common]
    accuracy = [[a for _, a in point] for point in at]
    return Curves(each[0].metric, common,
                  [float(np.mean([b for b, _ in point])) for point in at],
                  [round(float(np.mean(a)), 12) for a in accuracy],
                  low=[min(a) for a in accuracy], high=[max(a) for a in accuracy],
                  seeds=len(each))


def _curves(run: Sequence) -> Curves:
    """A run's curves: rows of one seed, or a list of row lists (`seed_band`)."""
    if run and not isinstance(run[0], Mapping):
        return seed_band(run) if len(run) > 1 else accuracy_curves(run[0])
    return accuracy_curves(run)


def plot_data(runs: Mapping[str, Sequence], num_classes: int | None = None) -> dict[str, Any]:
    """What `save_comparison_plot` draws, for `{name: metrics rows, or one list of rows per
    seed}`: `curves` per name (labelled with the seed count when several), `chance`
    (1/`num_classes`, None without it), `round_ticks` (integers from 0 to the last round),
    `round_limits`, `upload_limits` (MiB), `accuracy_limits` ((0, 1)) and `styles` (each
    name's marker, marker size and fill: when every run has fewer than `FEW_POINTS`
    evaluations, distinct hollow markers, each larger than the next, so that equal points stay
    visible).

    >>> row = {"round": 1, "communication_rounds": 1, "bytes_up_per_client": 1.0,
    ...        "eval_accuracy": 0.5}
    >>> styles = plot_data({"a": [row], "b": [row]})["styles"]
    >>> styles["a"]["marker"] != styles["b"]["marker"], styles["a"]["fillstyle"]
    (True, 'none')
    """
    curves = {name: _curves(run) for name, run in runs.items()}
    last = max((max(c.communication_rounds) for c in curves.values() if c.communication_rounds),
               default=1)
    step = max(1, math.ceil(last / 10))
    labels = {name: f"{name} ({c.seeds} seeds: mean, min–max)" if c.seeds > 1 else name
              for name, c in curves.items()}
    few = all(len(c.accuracy) < FEW_POINTS for c in curves.values())
    styles = {name: ({"marker": MARKERS[i % len(MARKERS)], "fillstyle": "none",
                      "markersize": 4 + 3 * (len(curves) - 1 - i)} if few else
                     {"marker": "o", "fillstyle": "full", "markersize": 4})
              for i, name in enumerate(curves)}
    return {"curves": curves, "labels": labels, "styles": styles,
            "chance": 1.0 / num_classes if num_classes else None,
            "round_ticks": list(range(0, last + step, step)),
            "round_limits": (0, last + 0.5 * step), "accuracy_limits": (0.0, 1.0),
            "upload_limits": (0.0, 1.05 * max((max(c.uploaded_bytes, default=0) / 2**20
                                               for c in curves.values()), default=0) or 1.0)}


def save_comparison_plot(path: os.PathLike | str, runs: Mapping[str, Sequence],
                         title: str = "", held_out: str = "test",
                         num_classes: int | None = None) -> pathlib.Path:
    """Writes a PNG with two panels, accuracy vs communication rounds and vs uploaded MiB per
    client, one line per run (`{name: metrics rows}`, or one list of rows per seed: drawn with
    its min–max band) and the chance line at 1/`num_classes` (see `plot_data`); returns its path.
    `held_out` names the evaluated split in the axis label ("dev" for SST-2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = plot_data(runs, num_classes)
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.0))
    for name, c in data["curves"].items():
        for ax, x in ((axes[0], c.communication_rounds),
                      (axes[1], [b / 2**20 for b in c.uploaded_bytes])):
            line, = ax.plot(x, c.accuracy, "-", label=data["labels"][name],
                            **data["styles"][name])
            if c.low is not None:
                ax.fill_between(x, c.low, c.high, color=line.get_color(), alpha=0.2,
                                linewidth=0)
    metrics = sorted({c.metric for c in data["curves"].values()})
    ylabel = " / ".join(m.replace("eval_", f"{held_out} ").replace("_", " ") for m in metrics)
    for ax, xlabel in zip(axes, ("communication rounds", "uploaded MiB per client")):
        if data["chance"] is not None:
            ax.axhline(data["chance"], linestyle="--", linewidth=1, color="gray",
                       label=f"chance (1/{num_classes})")
        ax.set_ylim(*data["accuracy_limits"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_xticks(data["round_ticks"])
    axes[0].set_xlim(*data["round_limits"])
    axes[1].set_xlim(*data["upload_limits"])
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["ACCURACY_KEYS", "Curves", "FEW_POINTS", "MARKERS", "accuracy_curves", "plot_data", "save_comparison_plot",
           "seed_band"]
