"""tffl.runtime: the managed TFF worker runs computations and never outlives its owner."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import tensorflow_federated as tff

from tffl import runtime


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _mean(values):
    return tff.federated_mean(values)


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_runs_a_computation_and_stops_the_worker(tmp_path):
    with runtime.local_runtime(log_dir=tmp_path):
        assert _mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
        pids = runtime.running_workers()
        assert len(pids) == 1
    assert _gone(pids[0])
    assert runtime.running_workers() == []
    assert (tmp_path / "tff_worker.log").exists()


def test_worker_stopped_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with runtime.local_runtime():
            pids = runtime.running_workers()
            raise RuntimeError("boom")
    assert pids and all(_gone(p) for p in pids)


def test_readiness_timeout_is_a_clear_error(monkeypatch, tmp_path):
    # A "worker" that never answers: the readiness loop must give up with WorkerError.
    silent = tmp_path / "silent_worker"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    monkeypatch.setattr(runtime, "worker_binary_path", lambda: silent)
    worker = runtime.LocalWorker()
    with pytest.raises(runtime.WorkerError, match="not ready after 1 s"):
        worker.start(ready_timeout_s=1.0)
    assert worker.process is None


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import tensorflow_federated as tff
    from tffl import runtime

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(values):
        return tff.federated_mean(values)

    with runtime.local_runtime():
        mean([1.0, 2.0])
        print("READY", runtime.running_workers()[0], flush=True)
        time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_worker_outlives_a_killed_owner(sig):
    """SIGINT/SIGTERM run the teardown; SIGKILL is covered by PR_SET_PDEATHSIG."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"child did not start: {line!r}"
        worker_pid = int(line.split()[1])
        assert not _gone(worker_pid, timeout_s=0.2)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert _gone(worker_pid), f"worker {worker_pid} outlived its owner after {sig.name}"
        # The worker held no copy of our pipe: reading to EOF returns instead of hanging.
        assert proc.stdout.read() is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
