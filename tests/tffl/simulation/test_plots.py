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


def _rows(accuracies, first_round=1):
    return [{"round": t, "communication_rounds": t, "bytes_up_per_client": 1024.0,
             "eval_accuracy": a} for t, a in enumerate(accuracies, start=first_round)]


def test_a_short_run_has_integer_round_ticks_a_unit_accuracy_axis_and_the_chance_line():
    # A 3-round run evaluated at the end only: one point per algorithm.
    data = plots.plot_data({"rolora": [{"round": 3, "communication_rounds": 3,
                                        "eval_accuracy": 0.492}],
                            "ffa_lora": [{"round": 3, "communication_rounds": 3,
                                          "eval_accuracy": 0.491}]}, num_classes=2)
    assert data["round_ticks"] == [0, 1, 2, 3]
    assert data["round_limits"] == (0, 3.5)
    assert data["accuracy_limits"] == (0.0, 1.0)
    assert data["chance"] == 0.5
    assert plots.plot_data({"a": _rows([0.1] * 100)})["round_ticks"] == list(range(0, 101, 10))
    assert plots.plot_data({"a": _rows([0.1])})["chance"] is None


def test_several_seeds_are_drawn_as_their_mean_and_min_max_band(tmp_path):
    seeds = [_rows([0.2, 0.4, 0.6]), _rows([0.4, 0.6, 0.8]), _rows([0.3, 0.5])]
    data = plots.plot_data({"rolora": seeds, "fedavg": _rows([0.1, 0.2, 0.3])}, num_classes=10)
    band = data["curves"]["rolora"]
    assert band.communication_rounds == [1, 2]  # the rounds every seed evaluated
    assert band.accuracy == [0.3, 0.5]
    assert (band.low, band.high, band.seeds) == ([0.2, 0.4], [0.4, 0.6], 3)
    assert band.uploaded_bytes == [1024.0, 2048.0]
    assert data["labels"] == {"rolora": "rolora (3 seeds: mean, min–max)", "fedavg": "fedavg"}
    assert data["curves"]["fedavg"].low is None
    assert math.isclose(data["chance"], 0.1)
    path = plots.save_comparison_plot(tmp_path / "s.png", {"rolora": seeds}, num_classes=10)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
