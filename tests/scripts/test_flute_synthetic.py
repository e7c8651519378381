"""scripts/flute_synthetic.py in subprocesses: a tiny run writes the table, bad flags are one
line."""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "flute_synthetic.py"


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def test_tiny_run_prints_and_writes_the_table(tmp_path):
    proc = _run("--ks=2", "--num_clients=6", "--num_samples=8", "--rounds=3", "--report_rounds=2",
                "--seeds=0", "--fedrep_learning_rates=0.03", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[M=6 k=2 seed=0] flute η=0.03: round 3/3, error" in proc.stdout  # progress
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["flute", "fedrep_ri", "fedrep_mom"]
    for r in rows:
        assert float(r["error_round_3"]) > 0 and float(r["error_round_2"]) > 0
        assert r["num_clients"] == "6" and r["k"] == "2"
    table = (tmp_path / "results.md").read_text()
    assert "| M | k | method | η | round 2 | final (round 3) |" in table
    assert "| 6 | 2 | FLUTE | 0.03 |" in table and "| 6 | 2 | FedRep(RI) | 0.03 |" in table
    assert "rank-k optimum" in table and "Paper (flute.md" in table
    assert table.strip() in proc.stdout
    assert (tmp_path / "tff_worker.log").exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--ks=2,11"], "--ks"),
        (["--gamma1=-0.5"], "--gamma1"),
        (["--rounds=5", "--report_rounds=5"], "--report_rounds"),
        (["--methods=flute,nope"], "--methods"),
        (["--output_dir=/proc/tffl_not_writable"], "--output_dir"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path):
    if not any(a.startswith("--output_dir") for a in args):
        args = [*args, f"--output_dir={tmp_path}"]
    proc = _run(*args, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert flag in err[0] and "Traceback" not in proc.stderr
