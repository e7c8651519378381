"""scripts/adaptpfl_synthetic.py in subprocesses: a tiny run writes the table, bad flags are one
line."""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "adaptpfl_synthetic.py"


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def test_tiny_run_prints_and_writes_the_table(tmp_path):
    proc = _run("--num_clients=5", "--num_samples=12", "--dim=6", "--rank=2", "--rounds=3",
                "--alphas=0.3", "--seeds=0", "--head_steps=2", "--shortcut_steps=2",
                f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[m=12 seed=0] adaptpfl α=0.3: round 3/3, loss" in proc.stdout  # progress
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["alpha"]) for r in rows] == [
        ("fedrep", ""), ("fedrep_gd", "0.0"), ("adaptpfl", "0.3"), ("local", "")]
    assert all(float(r["personalized_error"]) > 0 for r in rows)
    assert rows[-1]["subspace_distance"] == ""  # local least squares has no B
    table = (tmp_path / "results.md").read_text()
    assert "| m | method | α | personalized error | dist(B, B*) |" in table
    assert "| 12 | AdaptPFL | 0.3 |" in table and "| 12 | FedRep (gradient heads) | 0 |" in table
    assert table.strip() in proc.stdout


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--alphas=0.3,1.5"], "--alphas"),
        (["--rank=20"], "--rank"),
        (["--shortcut_ridge=-1"], "--shortcut_ridge"),
        (["--learning_rate=0"], "--learning_rate"),
        (["--init=nope"], "--init"),
        (["--adaptpfl_variant=b", "--alphas=0.3,1"], "--alphas"),
        (["--shortcut_damping=0"], "--shortcut_damping"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path):
    proc = _run(*args, f"--output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert flag in err[0] and "Traceback" not in proc.stderr
