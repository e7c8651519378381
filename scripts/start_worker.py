r"""Starts one TFF C++ worker on this host for a run on another host (`--worker_addresses`).

    uv run python scripts/start_worker.py --port=8000
    # on the driver host, once every worker printed its "ready" line:
    uv run python scripts/train.py --worker_addresses=hostA:8000,hostB:8000 --output_dir=runs/x

The worker is tensorflow-federated 0.87.0's own `worker_binary` (the same binary the driver would
start locally; the driver and every worker need the same TFF version). It serves TFF's executor
gRPC service on all interfaces of this host, unencrypted and without authentication: use it on a
trusted network, or reach it through an SSH tunnel. It runs in the foreground until Ctrl-C /
SIGTERM (exit status 0), and dies with this script whatever the signal. A worker serves one
driver at a time; start one per driver. Its output goes to --log_file.

Prints one line when the worker answers:
    TFF worker ready: <host>:<port> (pid N, log <file>)
"""

from __future__ import annotations

import os
import sys

# Quiet TensorFlow's C++ logs before it is imported (tffl.runtime imports TFF).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import errno  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from experiments import cli  # noqa: E402

_PORT = flags.DEFINE_integer("port", 8000, "Port to serve on (all interfaces).")
_LOG_FILE = flags.DEFINE_string(
    "log_file", None, "The worker's log (default: <tmp>/tff_worker_<port>.log).")
_READY_TIMEOUT = flags.DEFINE_float(
    "ready_timeout", 60.0, "Seconds to wait for the worker to answer before giving up.")
_MAX_CONCURRENT_CALLS = flags.DEFINE_integer(
    "max_concurrent_computation_calls", -1,
    "Passed to the worker: at most this many parallel calls of one computation (e.g. clients of "
    "a federated_map); non-positive means unlimited.")


def _port_in_use(port: int) -> bool:
    """Whether something listens on `port`. The worker's gRPC server binds with SO_REUSEPORT, so
    it would share a busy port with another server instead of failing."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not 0 < _PORT.value < 65536:
        sys.stderr.write(f"start_worker.py: error: flag --port={_PORT.value}: must be in "
                         "1..65535\n")
        return 2
    if _port_in_use(_PORT.value):
        sys.stderr.write(f"start_worker.py: error: flag --port={_PORT.value}: the port is in use\n")
        return 2
    log_file = pathlib.Path(
        _LOG_FILE.value or pathlib.Path(tempfile.gettempdir()) / f"tff_worker_{_PORT.value}.log")
    from tffl import runtime

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    worker = runtime.LocalWorker(
        log_path=log_file, port=_PORT.value,
        max_concurrent_computation_calls=_MAX_CONCURRENT_CALLS.value)
    try:
        worker.start(ready_timeout_s=_READY_TIMEOUT.value)
        print(f"TFF worker ready: {socket.gethostname()}:{_PORT.value} (pid {worker.pid}, log "
              f"{log_file})", flush=True)
        code = worker.process.wait()
        sys.stderr.write(f"start_worker.py: error: the worker {runtime.exit_reason(code)}; "
                         f"see {log_file}\n")
        return 1
    except runtime.WorkerError as e:
        sys.stderr.write(f"start_worker.py: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        worker.stop()


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
