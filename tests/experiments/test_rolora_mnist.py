"""experiments/rolora_mnist.run_toy: one training run per setting and learning rate (replaced by
a recorder of its RunConfig that writes the summaries a finished run would; the runs' own
summaries are tested in tests/scripts/), reuse of complete runs, and the best-learning-rate table
checked against its own CSV."""

import csv
import json
import pathlib

import pytest
from absl import flags

from experiments import rolora_mnist
from scripts import rolora_mnist_toy

# Final test accuracy of (algorithm, learning rate): 0.05 wins for rolora, 0.5 for the others.
_ACCURACY = {("rolora", "0.5"): 0.61, ("rolora", "0.05"): 0.72, ("fedavg_lora", "0.5"): 0.55,
             ("fedavg_lora", "0.05"): 0.5, ("ffa_lora", "0.5"): 0.45, ("ffa_lora", "0.05"): 0.4}


def test_toy_runs_tabulate_the_best_learning_rate(tmp_path, monkeypatch):
    calls = []

    def fake_train(config, what, isolate=False):
        calls.append(config)
        run_dir = pathlib.Path(config.output.output_dir)
        lr = {0.5: "0.5", 0.05: "0.05"}[config.algorithm.learning_rate]
        for algorithm in rolora_mnist.TOY_ALGORITHMS:
            (run_dir / algorithm).mkdir(parents=True, exist_ok=True)
            accuracy = _ACCURACY[algorithm, lr]
            (run_dir / algorithm / "summary.json").write_text(json.dumps({
                "algorithm": algorithm, "best_eval_accuracy": accuracy + 0.01,
                "final": {"eval_accuracy": accuracy, "train_loss": 0.5}}))

    monkeypatch.setattr(rolora_mnist, "run_training", fake_train)
    table = rolora_mnist.run_toy(
        tmp_path, rolora_mnist.ToySweep(["2x2"], ["0.5", "0.05"], rounds=2, local_steps=3,
                                        data_dir="/data"), log=lambda line: None)
    assert len(calls) == 2
    first = calls[0]
    assert (first.task.task, first.task.num_clients, first.task.classes_per_client,
            first.algorithm.rounds, first.algorithm.local_steps, first.task.data_dir,
            first.algorithm.algorithm) == ("mnist", 2, 2, 2, 3, "/data",
                                           ("rolora", "fedavg_lora", "ffa_lora"))
    assert not first.output.resume
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    for algorithm in rolora_mnist.TOY_ALGORITHMS:
        best = max((r for r in rows if r["algorithm"] == algorithm),
                   key=lambda r: float(r["final_test_accuracy"]))
        assert (f"| 2 clients x 2 labels | {algorithm} | {float(best['learning_rate']):g} | "
                f"{float(best['final_test_accuracy']):.4f} |") in table
    assert "| 2 clients x 2 labels | rolora | 0.05 | 0.7200 | 0.7300 |" in table
    assert (tmp_path / "results.md").read_text().startswith(
        "uv run python scripts/rolora_mnist_toy.py --rounds=2 --local_steps=3")
    # Complete runs are reused: resumed (the run reloads its last checkpoint and stops).
    calls.clear()
    rolora_mnist.run_toy(
        tmp_path, rolora_mnist.ToySweep(["2x2"], ["0.5"], rounds=2, local_steps=3,
                                        data_dir="/data"), log=lambda line: None)
    assert calls and calls[0].output.resume


@pytest.mark.parametrize("args, message", [
    (["--settings=5by2"], "flag --settings: '5by2' is not NxK (e.g. 5x2)"),
    (["--rounds=0"], "flag --rounds=0: must be >= 1"),
])
def test_the_script_s_bad_flags_are_one_line(args, message, capsys):
    flag_values = flags.FlagValues()
    rolora_mnist_toy.define_flags(flag_values)
    with pytest.raises(SystemExit) as exited:
        rolora_mnist_toy.parse(["rolora_mnist_toy.py", *args], flag_values)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == f"rolora_mnist_toy.py: error: {message}"
