"""scripts/start_worker.py: a worker for `--worker_addresses` that serves until SIGTERM, refuses a
busy port, and never outlives the script. The worker runs the script in a child process (forked from a Python that has
imported TFF: tests/forked_python.py); its flag
checks run in this process (`start_worker.parse`, on a FlagValues of the test's own)."""

import os
import pathlib
import signal
import socket

import portpicker
import pytest
from absl import flags

from scripts import start_worker

from tests import forked_python
# the same federated mean and exit wait
from tests.tffl.runtime.runtime_helpers import federated_mean, gone
from tffl import runtime

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "start_worker.py"
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _flag_values() -> flags.FlagValues:
    flag_values = flags.FlagValues()
    start_worker.define_flags(flag_values)
    return flag_values


def _busy(port: int, capsys) -> tuple[int, str]:
    """`start_worker.py --port=<port>`'s flag check in this process: exit status and stderr."""
    with pytest.raises(SystemExit) as exited:
        start_worker.parse(["start_worker.py", f"--port={port}"], _flag_values())
    return exited.value.code, capsys.readouterr().err


def test_worker_serves_remote_runs_and_stops_on_sigterm(tmp_path, capsys):
    port = portpicker.pick_unused_port()
    log = tmp_path / "worker.log"
    proc = forked_python.popen_script(SCRIPT, f"--port={port}", f"--log_file={log}")
    try:
        line = proc.stdout.readline()
        assert line.startswith("TFF worker ready: ") and f":{port} (pid " in line, line
        worker_pid = int(line.split("(pid ")[1].split(",")[0])
        assert str(log) in line and log.exists()

        returncode, stderr = _busy(port, capsys)
        assert returncode == 2 and "--port" in stderr and "in use" in stderr

        for _ in range(2):  # a worker serves one run after another
            with runtime.remote_runtime([f"localhost:{port}", f"127.0.0.1:{port}"],
                                        ready_timeout_s=30):
                assert federated_mean([1.0, 2.0, 6.0, 3.0]) == pytest.approx(3.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert gone(worker_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()


def test_a_busy_port_and_a_bad_one_are_one_line(capsys):
    """The same refusal of a port something listens on, without a worker; and a port out of
    range."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        returncode, stderr = _busy(port, capsys)
    assert returncode == 2
    assert stderr == f"start_worker.py: error: flag --port={port}: the port is in use\n"
    returncode, stderr = _busy(70000, capsys)
    assert returncode == 2
    assert stderr == "start_worker.py: error: flag --port=70000: must be in 1..65535\n"


def test_the_script_owns_its_flags_for_helpshort():
    """Defined by the script's module, the flags are its key flags, which absl's --helpshort
    lists for the script run."""
    key_flags = {f.name for f in _flag_values().get_key_flags_for_module(start_worker.__name__)}
    assert key_flags == {"port", "log_file", "ready_timeout", "max_concurrent_computation_calls"}
