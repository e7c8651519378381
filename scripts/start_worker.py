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

from runner import cli  # noqa: E402

def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a FlagValues of
    its own in a test), registered for this module: run as a script, absl's --helpshort lists
    them."""
    d = cli.definer(flag_values)
    d.DEFINE_integer("port", 8000, "Port to serve on (all interfaces).")
    d.DEFINE_string(
        "log_file", None, "The worker's log (default: <tmp>/tff_worker_<port>.log).")
    d.DEFINE_float(
        "ready_timeout", 60.0, "Seconds to wait for the worker to answer before giving up.")
    d.DEFINE_integer(
        "max_concurrent_computation_calls", -1,
        "Passed to the worker: at most this many parallel calls of one computation (e.g. clients "
        "of a federated_map); non-positive means unlimited.")


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


def _refusal(flag_values: flags.FlagValues) -> str | None:
    """Why the flags cannot work (one line naming the flag), or None."""
    port = flag_values.port
    if not 0 < port < 65536:
        return f"flag --port={port}: must be in 1..65535"
    if _port_in_use(port):
        return f"flag --port={port}: the port is in use"
    return None


def parse(argv: list[str], flag_values: flags.FlagValues) -> None:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks them; a bad
    flag is one line on stderr and `SystemExit(2)`, as on the command line."""
    cli.parse_flags(argv, flag_values, __doc__)
    refusal = _refusal(flag_values)
    if refusal:
        sys.stderr.write(f"start_worker.py: error: {refusal}\n")
        sys.exit(2)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    refusal = _refusal(flags.FLAGS)
    if refusal:
        sys.stderr.write(f"start_worker.py: error: {refusal}\n")
        return 2
    fv = flags.FLAGS
    log_file = pathlib.Path(
        fv.log_file or pathlib.Path(tempfile.gettempdir()) / f"tff_worker_{fv.port}.log")
    from tffl.runtime import worker_connection, workers

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    worker = workers.LocalWorker(
        log_path=log_file, port=fv.port,
        max_concurrent_computation_calls=fv.max_concurrent_computation_calls)
    try:
        worker.start(ready_timeout_s=fv.ready_timeout)
        print(f"TFF worker ready: {socket.gethostname()}:{fv.port} (pid {worker.pid}, log "
              f"{log_file})", flush=True)
        code = worker.process.wait()
        sys.stderr.write(f"start_worker.py: error: the worker {workers.exit_reason(code)}; "
                         f"see {log_file}\n")
        return 1
    except worker_connection.WorkerError as e:
        sys.stderr.write(f"start_worker.py: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        worker.stop()


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=cli.parse_flags)
