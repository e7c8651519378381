"""Comparison plots of runs: test accuracy against communication rounds and against the bytes one
client has uploaded, the picture federated-LoRA methods are compared by.

A run is its metrics rows (`tffl.simulation.driver.read_metrics`). The accuracy is `eval_accuracy` (a
global model) or, for personalized runs, `eval_personal_accuracy`; the upload after round t is
Σ_{s≤t} `bytes_up_per_client`(s).

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

ACCURACY_KEYS = ("eval_accuracy", "eval_personal_accuracy")


@dataclasses.dataclass(frozen=True)
class Curves:
    """One run's evaluated rounds: communication rounds done, cumulative upload per client
    (bytes) and accuracy, aligned; `metric` names the accuracy column used."""

    metric: str
    communication_rounds: list[int]
    uploaded_bytes: list[float]
    accuracy: list[float]


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


def save_comparison_plot(path: os.PathLike | str, runs: Mapping[str, Sequence[Mapping]],
                         title: str = "", held_out: str = "test") -> pathlib.Path:
    """Writes a PNG with two panels, accuracy vs communication rounds and vs uploaded MiB per
    client, one line per run (`{name: metrics rows}`); returns its path. `held_out` names the
    evaluated split in the axis label ("dev" for SST-2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: accuracy_curves(rows) for name, rows in runs.items()}
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.0))
    for name, c in curves.items():
        axes[0].plot(c.communication_rounds, c.accuracy, "-o", markersize=3, label=name)
        axes[1].plot([b / 2**20 for b in c.uploaded_bytes], c.accuracy, "-o", markersize=3,
                     label=name)
    metrics = sorted({c.metric for c in curves.values()})
    ylabel = " / ".join(m.replace("eval_", f"{held_out} ").replace("_", " ") for m in metrics)
    for ax, xlabel in zip(axes, ("communication rounds", "uploaded MiB per client")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["ACCURACY_KEYS", "Curves", "accuracy_curves", "save_comparison_plot"]
