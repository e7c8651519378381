"""tffl.simulation.plots: the curves against hand-computed sums, and the PNG."""

import math

from tffl.simulation import plots


def test_curves_accumulate_the_upload_and_keep_evaluated_rounds():
    rows = [
        {"round": 1, "communication_rounds": 1, "bytes_up_per_client": 100.0,
         "eval_accuracy": ""},
        {"round": 2, "communication_rounds": 2, "bytes_up_per_client": 60.0,
         "eval_accuracy": 0.25},
        {"round": 3, "communication_rounds": 3, "bytes_up_per_client": 100.0,
         "eval_accuracy": math.nan},
        {"round": 4, "communication_rounds": 4, "bytes_up_per_client": 60.0,
         "eval_accuracy": 0.75},
    ]
    curves = plots.accuracy_curves(rows)
    assert curves.metric == "eval_accuracy"
    assert curves.communication_rounds == [2, 4]
    assert curves.uploaded_bytes == [160.0, 320.0]
    assert curves.accuracy == [0.25, 0.75]


def test_personalized_runs_use_the_personal_accuracy(tmp_path):
    rows = [{"round": 1, "bytes_up_per_client": 8.0, "eval_personal_accuracy": 0.5}]
    curves = plots.accuracy_curves(rows)
    assert (curves.metric, curves.communication_rounds, curves.uploaded_bytes) == (
        "eval_personal_accuracy", [1], [8.0])
    path = plots.save_comparison_plot(tmp_path / "c.png", {"a": rows, "b": rows}, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
