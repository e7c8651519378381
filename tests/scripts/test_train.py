"""scripts/train.py end to end, in subprocesses: flags, outputs, interrupt and resume, no orphans."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tffl import simulation

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train.py"
_FAST = ["--num_clients=6", "--clients_per_round=3", "--local_steps=3", "--eval_every=2"]


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _rows(path):
    drop = set(simulation.TIMING_COLUMNS)
    return [{k: v for k, v in r.items() if k not in drop}
            for r in simulation.read_metrics(path / "metrics.csv")]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--algorithm=nope"], "--algorithm"),
        (["--task=nope"], "--task"),
        (["--num_clients=0"], "--num_clients"),
        (["--num_clients=4", "--clients_per_round=5"], "--clients_per_round"),
        (["--learning_rate=-1"], "--learning_rate"),
        (["--output_dir=/proc/tffl_not_writable"], "--output_dir"),
        (["--resume"], "--resume"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag):
    proc = _run(*args, timeout=120)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert flag in err[0] and "Traceback" not in proc.stderr
    if flag == "--algorithm":
        assert "fedavg" in err[0]  # the allowed values are named


def test_job_writes_results_and_refuses_to_overwrite(tmp_path):
    proc = _run(*_FAST, "--rounds=3", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "done: 3 rounds" in proc.stdout and "round 3/3" in proc.stdout
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[-1]["bytes_up_per_client"] > 0 and "eval_accuracy" in rows[-1]
    assert (tmp_path / "summary.json").exists()
    again = _run(*_FAST, "--rounds=3", f"--output_dir={tmp_path}", timeout=120)
    assert again.returncode == 2 and "--resume" in again.stderr
    assert _rows(tmp_path) == rows  # nothing overwritten


def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path):
    # Enough rounds (each takes well under a second) that SIGINT after round 2 lands mid-run.
    rounds = "--rounds=30"
    full = tmp_path / "full"
    assert _run(*_FAST, rounds, f"--output_dir={full}").returncode == 0

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *_FAST, rounds, f"--output_dir={cut}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    workers = []
    try:
        for line in proc.stdout:
            workers += [c.pid for c in psutil.Process(proc.pid).children()
                        if "worker_binary" in " ".join(c.cmdline())]
            if line.startswith("round  2/30"):
                proc.send_signal(signal.SIGINT)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert proc.returncode != 0
    assert workers, "the run should have started a TFF worker"
    time.sleep(0.5)
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    done = simulation.read_metrics(cut / "metrics.csv")
    assert 2 <= len(done) < 30

    resumed = _run(*_FAST, rounds, f"--output_dir={cut}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {cut} after round" in resumed.stdout
    assert _rows(cut) == _rows(full)
