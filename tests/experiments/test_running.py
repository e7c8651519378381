"""`experiments.running`: the train.py subprocesses an experiment starts."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from experiments import running

_CHILD = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def stopped(signum, frame):
        (out / "stopped").write_text(str(signum))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    (out / "pid").write_text(str(os.getpid()))
    time.sleep(120)
""")


def _wait_for(path: pathlib.Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_is_sent_sigterm_when_the_experiment_is_sigkilled(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from experiments import running; "
         "running._run_command(sys.argv[1:], 'child')", str(child), str(tmp_path)],
        cwd=running.ROOT, stdout=subprocess.DEVNULL)
    try:
        assert _wait_for(tmp_path / "pid", 30), "the child did not start"
        parent.kill()   # no handler, no `finally`: only the kernel can tell the child
        parent.wait()
        assert _wait_for(tmp_path / "stopped", 10), "the child outlived its SIGKILLed parent"
        assert (tmp_path / "stopped").read_text() == str(int(signal.SIGTERM))
    finally:
        parent.kill()
        if (tmp_path / "pid").exists():
            try:
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_failed_run_is_one_step_error_naming_it(tmp_path):
    child = tmp_path / "fails.py"
    child.write_text("raise SystemExit(3)\n")
    with pytest.raises(running.StepError, match=r"^my run failed \(exit status 3\)$"):
        running._run_command([child], "my run")


def test_std_is_the_sample_std():
    """ddof = 1: (0.8, 0.9) → √((0.05² + 0.05²) / 1) = 0.0707107; (1, 2, 3, 4) → √(5/3) =
    1.2909944; one value has no std; missing values are left out."""
    assert running._std([0.8, 0.9]) == pytest.approx(0.0707107, abs=1e-7)
    assert running._std([1.0, 2.0, None, 3.0, 4.0]) == pytest.approx(1.2909944, abs=1e-7)
    assert running._std([3.0]) != running._std([3.0])   # NaN
    assert running._mean_std([0.8, 0.9], "{:.4f}") == "0.8500 ± 0.0707"
