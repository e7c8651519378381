"""runner.comparison: train.py's comparison table and final line name the evaluated split."""

from runner import cli, comparison


def test_the_final_line_names_the_dev_set_with_eval_test():
    assert (comparison.final_eval({"eval_loss": 0.5, "eval_accuracy": 0.8})
            == "test loss 0.5000, test accuracy 0.8000")
    assert (comparison.final_eval({"eval_loss": 0.4, "eval_accuracy": 0.8154,
                                   "eval_test_accuracy": 0.8221}, "dev")
            == "dev loss 0.4000, dev accuracy 0.8154; labeled test accuracy 0.8221")
    assert (comparison.final_eval({"eval_personal_accuracy": 0.8073}, "dev")
            == "personalized dev accuracy 0.8073")
    assert comparison.final_eval({}) == "not evaluated"


def test_comparison_table_names_the_dev_set_and_the_labeled_test_split():
    summary = {"algorithm": "rolora", "communication_rounds": 4, "best_eval_accuracy": 0.82,
               "best_personal_accuracy": None, "upload_bytes_per_client_total": 4096,
               "wall_seconds_this_run": 1.0,
               "final": {"eval_accuracy": 0.81, "eval_test_accuracy": 0.8429, "train_loss": 0.3}}
    rows = comparison.comparison_rows([summary])
    dev = cli.markdown_table(rows, comparison.table_columns("dev", True)).splitlines()[0]
    test = cli.markdown_table(rows, comparison.table_columns("test", False)).splitlines()[0]
    assert dev.startswith("| algorithm | comm. rounds | dev acc (final) | dev acc (best) | "
                          "labeled test acc (final) | ")
    assert test.startswith("| algorithm | comm. rounds | test acc (final) | test acc (best) | ")
    assert "labeled" not in test
    assert rows[0]["eval_test_accuracy"] == 0.8429
    assert rows[0]["upload_per_round_kib"] == 1.0  # 4096 bytes over 4 rounds = 1 KiB per round


def test_write_comparison_writes_the_table_and_plot(tmp_path):
    summaries = []
    for name, accuracy in (("rolora", 0.84), ("ffa_lora", 0.80)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text(
            "round,eval_accuracy,bytes_up_per_client\n"
            f"1,{accuracy - 0.1},2048\n2,{accuracy},2048\n")
        summaries.append({"algorithm": name, "communication_rounds": 2, "flags": {"rank": 4},
                          "best_eval_accuracy": accuracy, "best_personal_accuracy": None,
                          "upload_bytes_per_client_total": 4096, "wall_seconds_this_run": 1.0,
                          "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy}})
    table = comparison.write_comparison(tmp_path, summaries, "sst2", eval_test=True)
    assert "| rolora | 2 | 0.8400 | 0.8400 | 0.8400 |" in table
    assert "| 2.00 |" in table  # 4096 bytes / 2 rounds / 1024
    # Without the config.json of a train.py run there is no rerun line above the table.
    assert (tmp_path / "comparison.md").read_text().startswith("| algorithm |")
    assert (tmp_path / "comparison.png").stat().st_size > 0
    assert (tmp_path / "comparison.csv").read_text().splitlines()[0].split(",")[4] == (
        "eval_test_accuracy")


def test_columns_no_run_has_are_left_out_and_missing_cells_are_blank(tmp_path):
    """Global-model runs have no personalized accuracy, runs without SRPFL no simulated time: no
    `nan` columns; FedRep's personalized accuracy beside FedAvg's blank cell."""
    def summary(name, final, best_personal=None):
        return {"algorithm": name, "communication_rounds": 2, "best_eval_accuracy": None,
                "best_personal_accuracy": best_personal, "upload_bytes_per_client_total": 2048,
                "wall_seconds_this_run": 1.0, "final": final}

    summaries = [summary("fedavg", {"eval_accuracy": 0.5, "train_loss": float("nan")}),
                 summary("fedrep", {"eval_personal_accuracy": 0.75}, best_personal=0.8)]
    for s in summaries:
        (tmp_path / s["algorithm"]).mkdir()
        (tmp_path / s["algorithm"] / "metrics.csv").write_text("round,eval_accuracy\n1,0.5\n")
    table = comparison.write_comparison(tmp_path, summaries, "digits", eval_test=False)
    assert "nan" not in table
    assert table.splitlines()[0] == (
        "| algorithm | comm. rounds | test acc (final) | personalized acc (final) | "
        "personalized acc (best) | upload KiB/client/comm. round | seconds |")
    assert table.splitlines()[2] == "| fedavg | 2 | 0.5000 |  |  | 1.00 | 1.0 |"
    assert table.splitlines()[3] == "| fedrep | 2 |  | 0.7500 | 0.8000 | 1.00 | 1.0 |"
    assert (tmp_path / "comparison.csv").read_text().splitlines()[1] == "fedavg,2,0.5,,,1.0,1.0"
