"""scripts/train.py on several TFF workers (tffl.runtime, docs/runtime.md), as child processes
watched from here: two workers match one, a killed worker stops the run and --resume completes it,
the in-process runtime on two logical CPUs (a child whose TensorFlow has run no op yet: logical
devices are set before TensorFlow starts). The children are forked from a Python that has imported
TFF (tests/forked_python.py). All large (`pytest -m large`)."""

import contextlib
import os
import signal
import time

import psutil
import pytest

from tests import forked_python
from tests.scripts import train_runs
from tffl.simulation import metrics_log

pytestmark = pytest.mark.large


def _watched_run(*args, kill_after_round=None):
    """Runs train.py; with `kill_after_round`, SIGKILLs its last TFF worker once that round's
    progress line is printed. Returns (process, stderr, the workers' pids); checks that no worker
    outlives the run."""
    proc = forked_python.popen_script(train_runs.SCRIPT, *args)
    workers = set()
    try:
        for line in proc.stdout:
            for child in psutil.Process(proc.pid).children():
                with contextlib.suppress(psutil.Error):  # e.g. a killed worker, not yet reaped
                    if "worker_binary" in " ".join(child.cmdline()):
                        workers.add(child.pid)
            if kill_after_round and line.split("/")[0].split() == ["round", str(kill_after_round)]:
                os.kill(max(workers), signal.SIGKILL)
                kill_after_round = None
        stderr = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    time.sleep(0.5)
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return proc, stderr, workers


def _assert_rows_close(a, b):
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for row_a, row_b in zip(a, b):
        assert set(row_a) == set(row_b)
        for key in row_a:
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-6), key


_WORKER_ROUNDS = "--rounds=8"


@pytest.fixture(scope="module")
def one_worker_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_worker")
    from scripts import train

    # In this process (the reference run is not about processes); its rows must match the
    # children's to rel=1e-5.
    status = train.run_command_line(["train.py", *train_runs.FAST, _WORKER_ROUNDS,
                                     f"--output_dir={out}"])
    assert status == 0
    return train_runs.rows(out)


def test_two_workers_match_one_worker(one_worker_run, tmp_path):
    proc, stderr, workers = _watched_run(*train_runs.FAST, _WORKER_ROUNDS, "--workers=2",
                                         f"--output_dir={tmp_path}")
    assert proc.returncode == 0, stderr
    assert len(workers) == 2
    assert (tmp_path / "tff_worker_0.log").exists() and (tmp_path / "tff_worker_1.log").exists()
    _assert_rows_close(train_runs.rows(tmp_path), one_worker_run)


def test_killed_worker_stops_the_run_and_resume_completes_it(one_worker_run, tmp_path):
    proc, stderr, workers = _watched_run(*train_runs.FAST, _WORKER_ROUNDS, "--workers=2",
                                         f"--output_dir={tmp_path}", kill_after_round=2)
    assert proc.returncode == 3, stderr
    err = [line for line in stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(err) == 1 and "Traceback" not in stderr, stderr
    assert f"(pid {max(workers)}, localhost:" in err[0] and "killed by SIGKILL" in err[0]
    assert f"log {tmp_path}/tff_worker_" in err[0] and "--resume" in err[0]
    done = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert 2 <= len(done) < 8

    proc, stderr, _ = _watched_run(*train_runs.FAST, _WORKER_ROUNDS, "--workers=2",
                                   f"--output_dir={tmp_path}", "--resume")
    assert proc.returncode == 0, stderr
    _assert_rows_close(train_runs.rows(tmp_path), one_worker_run)


def test_in_process_runtime_on_two_logical_cpus_matches_one_worker(one_worker_run, tmp_path):
    """--runtime=distribute: the same rounds in this process, the clients split over two
    logical CPU devices by MirroredStrategy, and no TFF worker started."""
    proc, stderr, workers = _watched_run(*train_runs.FAST, _WORKER_ROUNDS, "--runtime=distribute",
                                         "--logical_cpus=2", "--devices=CPU:0,CPU:1",
                                         f"--output_dir={tmp_path}")
    assert proc.returncode == 0, stderr
    assert workers == set()
    _assert_rows_close(train_runs.rows(tmp_path), one_worker_run)
