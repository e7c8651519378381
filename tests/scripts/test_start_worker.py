"""scripts/start_worker.py: a worker for `--worker_addresses` that serves until SIGTERM, refuses a
busy port, and never outlives the script."""

import os
import pathlib
import signal
import subprocess
import sys

import portpicker
import pytest

from tests.tffl.runtime.test_runtime import _gone, _mean  # the same federated mean and exit wait
from tffl import runtime

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "start_worker.py"
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def test_worker_serves_remote_runs_and_stops_on_sigterm(tmp_path):
    port = portpicker.pick_unused_port()
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), f"--port={port}", f"--log_file={log}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("TFF worker ready: ") and f":{port} (pid " in line, line
        worker_pid = int(line.split("(pid ")[1].split(",")[0])
        assert str(log) in line and log.exists()

        busy = subprocess.run([sys.executable, str(SCRIPT), f"--port={port}"],
                              capture_output=True, text=True, timeout=120, env=_ENV)
        assert busy.returncode == 2 and "--port" in busy.stderr and "in use" in busy.stderr

        for _ in range(2):  # a worker serves one run after another
            with runtime.remote_runtime([f"localhost:{port}", f"127.0.0.1:{port}"],
                                        ready_timeout_s=30):
                assert _mean([1.0, 2.0, 6.0, 3.0]) == pytest.approx(3.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _gone(worker_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
