"""Every evaluated example's prediction, kept compressed in the run's folder.

A classifier's evaluation reduces N predictions to one accuracy; a paired bootstrap over seeds
and examples (`runner.verdicts.paired_bootstrap`) needs the predictions themselves. A
`PredictionLog` gives each evaluated split a sink (`make_keras_evaluator(on_predictions=...)`)
that keeps the latest evaluation's predicted class and label of every example, in the split's
example order; `save(run_dir, round_num)` adds them to the run's `predictions.npz`
(`numpy.savez_compressed`: `round_<r>/<split>` the predicted classes after round r,
`label/<split>` the labels; int16), keeping the rounds the file already held (a resumed run's
evaluations of rounds after its checkpoint replace those the stopped run wrote).
`read_predictions(run_dir)` reads it back.

>>> log = PredictionLog()
>>> sink = log.sink("eval", order=np.array([2, 0, 1]))   # evaluated in the order 2, 0, 1
>>> sink(np.array([1, 0, 1]), np.array([1, 1, 0]))
>>> log.save(run_dir / "predictions_example", round_num=5)
>>> rounds, labels = read_predictions(run_dir / "predictions_example")
>>> rounds[5]["eval"].tolist(), labels["eval"].tolist()    # in the split's example order
([0, 1, 1], [1, 0, 1])
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import numpy as np

PREDICTIONS_FILE = "predictions.npz"


class PredictionLog:
    """The latest evaluation's predictions and labels per split (see the module docstring)."""

    def __init__(self):
        self._latest: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def sink(self, split: str, order=None) -> Callable[[np.ndarray, np.ndarray], None]:
        """`(predicted, labels) -> None` for `split`'s evaluator: `order` (or `order()`, read on
        the first call) gives the example index of each evaluated position (None: the split's
        own order)."""

        def record(predicted: np.ndarray, labels: np.ndarray) -> None:
            positions = order() if callable(order) else order
            predicted, labels = np.asarray(predicted), np.asarray(labels)
            if positions is not None:
                positions = np.asarray(positions)
                if len(positions) != len(predicted):
                    raise ValueError(f"split {split!r}: {len(predicted)} predictions for "
                                     f"{len(positions)} examples")
                in_order = np.empty_like(predicted), np.empty_like(labels)
                in_order[0][positions], in_order[1][positions] = predicted, labels
                predicted, labels = in_order
            self._latest[split] = (predicted.astype(np.int16), labels.astype(np.int16))

        return record

    def save(self, run_dir: str | pathlib.Path, round_num: int) -> None:
        """Adds the latest predictions, as round `round_num`'s, to `run_dir`'s PREDICTIONS_FILE
        (written whole, then moved into place)."""
        if not self._latest:
            return
        path = pathlib.Path(run_dir) / PREDICTIONS_FILE
        arrays = dict(np.load(path)) if path.exists() else {}
        for split, (predicted, labels) in self._latest.items():
            arrays[f"round_{round_num:06d}/{split}"] = predicted
            arrays[f"label/{split}"] = labels
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial.npz")
        np.savez_compressed(partial, **arrays)
        partial.replace(path)


def read_predictions(run_dir: str | pathlib.Path
                     ) -> tuple[dict[int, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """`({round: {split: predicted classes}}, {split: labels})` of a run's PREDICTIONS_FILE
    (empty dicts for a run without one)."""
    path = pathlib.Path(run_dir) / PREDICTIONS_FILE
    if not path.exists():
        return {}, {}
    rounds: dict[int, dict[str, np.ndarray]] = {}
    labels: dict[str, np.ndarray] = {}
    with np.load(path) as data:
        for key in data.files:
            kind, split = key.split("/", 1)
            if kind == "label":
                labels[split] = data[key]
            else:
                rounds.setdefault(int(kind.removeprefix("round_")), {})[split] = data[key]
    return dict(sorted(rounds.items())), labels
