"""What scripts/train.py reports at the end: the comparison of several algorithms
(comparison.csv / .md / .png) and each run's final evaluation in words.

Each evaluation is named by its split, as the run's task reported it (`summary.json`'s
`eval_split`: SST-2's dev set, whose labeled test split --eval_test adds beside it; a user's dev
file; the review domains' test split; ...); summaries from before that field fall back to
`held_out_name`.
A column no run has a value for (personalized accuracy of global-model runs, simulated time
without SRPFL) is left out; a run without a value in a kept column has a blank cell.

>>> held_out_name("sst2"), held_out_name("mnist"), eval_split([{"eval_split": "validation"}], "x")
('dev', 'test', 'validation')
>>> final_eval({"eval_loss": 0.4, "eval_accuracy": 0.8154, "eval_test_accuracy": 0.8221}, "dev")
'dev loss 0.4000, dev accuracy 0.8154; labeled test accuracy 0.8221'
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from runner import cli

# The classes of each task (the plots' chance line, 1/classes).
NUM_CLASSES = {"digits": 10, "mnist": 10, "sst2": 2, "reviews": 2}


def held_out_name(task: str) -> str:
    """The split `task` evaluated on before runs recorded it: "dev" for SST-2 (and its
    instruction form), "test" otherwise."""
    return "dev" if task in ("sst2", "sst2_instruct") else "test"


def eval_split(summaries: Sequence[Mapping[str, Any]], task: str) -> str:
    """The evaluated split's name the runs' summaries record (`held_out_name(task)` for
    summaries without it)."""
    return next((s["eval_split"] for s in summaries if s.get("eval_split")),
                held_out_name(task))


def table_columns(held_out: str, eval_test: bool) -> tuple[tuple[str, str, str], ...]:
    """The comparison table's (header, row key, format) columns; `held_out` names the evaluated
    split, `eval_test` adds SST-2's labeled test accuracy."""
    test_columns = ((("labeled test acc (final)", "eval_test_accuracy", "{:.4f}"),)
                    if eval_test else ())
    return (
        ("algorithm", "algorithm", "{}"),
        ("comm. rounds", "communication_rounds", "{}"),
        (f"{held_out} acc (final)", "eval_accuracy", "{:.4f}"),
        (f"{held_out} acc (best)", "best_eval_accuracy", "{:.4f}"),
        *test_columns,
        ("personalized acc (final)", "eval_personal_accuracy", "{:.4f}"),
        ("personalized acc (best)", "best_personal_accuracy", "{:.4f}"),
        ("simulated time", "simulated_time", "{:.1f}"),
        ("train loss", "train_loss", "{:.4f}"),
        ("upload KiB/client/comm. round", "upload_per_round_kib", "{:.2f}"),
        ("seconds", "wall_seconds_this_run", "{:.1f}"),
    )


def _value(value: Any) -> Any:
    """`value`, or None when it is missing (None, NaN)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def comparison_rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict]:
    """One row per run summary (`summary.json`): final and best accuracies, and the upload per
    client per communication round in KiB (total upload bytes / rounds / 1024); a value a run
    does not have is None."""
    rows = []
    for s in summaries:
        final = s["final"]
        comm = max(1, s["communication_rounds"])
        rows.append({key: _value(value) for key, value in {
            "algorithm": s["algorithm"],
            "communication_rounds": s["communication_rounds"],
            "eval_accuracy": final.get("eval_accuracy"),
            "eval_test_accuracy": final.get("eval_test_accuracy"),
            "best_eval_accuracy": s["best_eval_accuracy"],
            "eval_personal_accuracy": final.get("eval_personal_accuracy"),
            "best_personal_accuracy": s["best_personal_accuracy"],
            "simulated_time": final.get("simulated_time"),
            "train_loss": final.get("train_loss"),
            "upload_per_round_kib": s["upload_bytes_per_client_total"] / comm / 1024,
            "wall_seconds_this_run": s["wall_seconds_this_run"],
        }.items()})
    return rows


def present_columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]
                    ) -> list[tuple[str, str, str]]:
    """The `columns` (title, key, format) at least one row has a value for.

    >>> present_columns([{"a": 1, "b": None}], [("A", "a", "{}"), ("B", "b", "{}")])
    [('A', 'a', '{}')]
    """
    return [c for c in columns if any(_value(row.get(c[1])) is not None for row in rows)]


def write_comparison(output_dir: pathlib.Path, summaries: Sequence[Mapping[str, Any]],
                     task: str, eval_test: bool, preamble: str = "") -> str:
    """Writes comparison.csv, comparison.md and comparison.png (accuracy vs communication rounds
    and vs uploaded bytes, with the chance line) of the runs in `output_dir/<algorithm>/`, the
    Markdown table under `preamble` (a train.py comparison's: the command that reruns it,
    `runner.run.report`); returns the Markdown table (columns no run has a value for left
    out)."""
    from tffl.simulation import metrics_log
    from tffl.simulation import plots

    runs = {s["algorithm"]: metrics_log.read_metrics(output_dir / s["algorithm"] / "metrics.csv")
            for s in summaries}
    held_out = eval_split(summaries, task)
    num_classes = next((s["num_classes"] for s in summaries if s.get("num_classes")),
                       NUM_CLASSES.get(task))
    plots.save_comparison_plot(output_dir / "comparison.png", runs, title=task, held_out=held_out,
                               num_classes=num_classes)
    rows = comparison_rows(summaries)
    return cli.write_table(output_dir, "comparison", rows,
                           present_columns(rows, table_columns(held_out, eval_test)),
                           preamble=preamble)


def final_eval(final: Mapping[str, float], held_out: str = "test") -> str:
    """A run's final evaluation in words; `held_out` names the evaluated split ("dev" for SST-2,
    whose labeled test split --eval_test evaluates beside it)."""
    parts = []
    if "eval_accuracy" in final:
        parts.append("{0} loss {1:.4f}, {0} accuracy {2:.4f}".format(
            held_out, final.get("eval_loss", float("nan")), final["eval_accuracy"]))
    if "eval_test_accuracy" in final:
        parts.append("labeled test accuracy {:.4f}".format(final["eval_test_accuracy"]))
    if "eval_personal_accuracy" in final:
        parts.append("personalized {} accuracy {:.4f}".format(
            held_out, final["eval_personal_accuracy"]))
    return "; ".join(parts) or "not evaluated"
