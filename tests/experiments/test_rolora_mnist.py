"""experiments/rolora_mnist.run_toy: train.py runs per setting and learning rate, reused when
complete, and the best-learning-rate table checked against its own CSV."""

import csv
import subprocess
import sys

import pytest

from experiments import rolora_mnist
from tests.conftest import REPO_ROOT


def test_toy_runs_tabulate_the_best_learning_rate(shared_data, tmp_path):
    lines = []
    table = rolora_mnist.run_toy(tmp_path, ["2x2"], ["0.5", "0.05"], rounds=2, local_steps=2,
                                 data_dir=str(shared_data), log=lines.append)
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["algorithm"], float(r["learning_rate"])) for r in rows) == sorted(
        (a, lr) for a in rolora_mnist.TOY_ALGORITHMS for lr in (0.5, 0.05))
    for algorithm in rolora_mnist.TOY_ALGORITHMS:
        best = max((r for r in rows if r["algorithm"] == algorithm),
                   key=lambda r: float(r["final_test_accuracy"]))
        assert (f"| 2 clients x 2 labels | {algorithm} | {float(best['learning_rate']):g} | "
                f"{float(best['final_test_accuracy']):.4f} |") in table
    assert (tmp_path / "results.md").read_text().startswith(
        "uv run python scripts/rolora_mnist_toy.py --rounds=2 --local_steps=2")


@pytest.mark.parametrize("args, message", [
    (["--settings=5by2"], "flag --settings: '5by2' is not NxK (e.g. 5x2)"),
    (["--rounds=0"], "flag --rounds=0: must be >= 1"),
])
def test_the_script_s_bad_flags_are_one_line(args, message):
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "rolora_mnist_toy.py"),
                           *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"rolora_mnist_toy.py: error: {message}"
