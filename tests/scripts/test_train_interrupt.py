"""scripts/train.py as a child process, for what is about processes: the exit status of the real
interpreter for a worker that never answers (the fast tier's smoke test of the script), and
Ctrl-C, then --resume, with no TFF worker left behind (large)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from runner import machine
from tests import forked_python
from tests.scripts import train_runs
from tffl.simulation import driver, metrics_log

_run = train_runs.run_child


def test_unreachable_worker_address_is_one_clear_line(tmp_path):
    import portpicker

    address = f"localhost:{portpicker.pick_unused_port()}"
    proc = _run(*train_runs.FAST, "--rounds=2", f"--worker_addresses={address}",
                "--worker_timeout=1", f"--output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 3
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"TFF worker #0 at {address} was not ready after 1 s" in err[0]


@pytest.mark.large
def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path, capsys):
    # SIGINT after round 2 must land mid-run however far this reader lags behind the run: the
    # run's stdout is a one-page pipe, so it blocks on its progress lines a few dozen rounds
    # later until this test reads on, and this test reads on only after sending the signal.
    # Evaluation at rounds 30 and 60 only: the rows compared below include both, one on each side
    # of any interrupt, and the 60 rounds cost half as much as with FAST's evaluation every 2.
    rounds = ["--rounds=60", "--eval_every=30"]
    full = tmp_path / "full"  # the reference run, in this process
    assert train_runs.run_in_process(capsys, *train_runs.FAST, *rounds,
                                     f"--output_dir={full}").returncode == 0

    cut = tmp_path / "cut"
    stderr_file = open(tmp_path / "cut.stderr", "w+")  # a file: a full pipe would block the run
    proc = subprocess.Popen(
        [sys.executable, str(train_runs.SCRIPT), *train_runs.FAST, *rounds, f"--output_dir={cut}"],
        stdout=subprocess.PIPE, stderr=stderr_file, text=True, pipesize=4096,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), cwd=train_runs.SCRIPT.parents[1],
        # A shell without job control starts background jobs with SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler: give the run the default disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    workers = []
    try:
        for line in proc.stdout:
            workers += [c.pid for c in psutil.Process(proc.pid).children()
                        if "worker_binary" in " ".join(c.cmdline())]
            if line.startswith("round  2/60"):
                proc.send_signal(signal.SIGINT)
                break
        proc.stdout.read()  # unblocks the run, which is now interrupted
        proc.wait(timeout=60)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        stderr_file.close()
    assert proc.returncode != 0
    assert workers, "the run should have started a TFF worker"
    time.sleep(0.5)
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    done = metrics_log.read_metrics(cut / "metrics.csv")
    assert 2 <= len(done) < 60
    # Ctrl-C is one line: the last checkpointed round and the command that continues the run.
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    found = re.search(r"interrupted; checkpointed: round (\d+); continue with: ", lines[0])
    assert found and 1 <= int(found.group(1)) <= len(done), lines[0]
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[:2] == ["python", "scripts/train.py"] and command[-1] == "--resume"

    resumed = forked_python.run_script(*command[1:], timeout=300, cwd=train_runs.SCRIPT.parents[1])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {cut} after round" in resumed.stdout
    assert train_runs.rows(cut) == train_runs.rows(full)
    # Each leg's first round and machine (runner.machine), in the summary too.
    summary = json.loads((cut / "summary.json").read_text())
    assert [s["first_round"] for s in summary["legs"]] == [1, int(found.group(1)) + 1]
    assert summary["legs"][-1]["machine"] == summary["machine"]
    assert [s["first_round"] for s in machine.read_legs(full)] == [1]
    # TensorBoard lost no round either: the interrupted run flushed what it released before
    # exiting, and the resumed run released the rest.
    assert _tensorboard_steps(cut, "train_loss") == set(range(1, 61))


def _tensorboard_steps(output_dir, tag):
    import tensorflow as tf

    steps = set()
    for events in (output_dir / driver.TENSORBOARD_DIR).glob("events*"):
        for event in tf.data.TFRecordDataset(str(events)).as_numpy_iterator():
            parsed = tf.compat.v1.Event.FromString(event)
            steps |= {parsed.step for value in parsed.summary.value if value.tag == tag}
    return steps
