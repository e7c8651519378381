"""TFF worker processes: started, guarded against outliving Python, and stopped (`tffl.runtime`).

The gRPC side of a worker (its channel, readiness and loss checks) and workers started elsewhere
(`RemoteWorker`) are in `tffl.runtime.worker_connection`.
"""


from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import portpicker
import tensorflow_federated as tff

from tffl.runtime.tff_internals import context_stack_impl, remote_executor_grpc_stub
from tffl.runtime import worker_connection


WORKER_BINARY_NAME = "worker_binary"
_PR_SET_PDEATHSIG = 1
# After an RPC fails, how long a local worker may take to be seen as exited.
_EXIT_GRACE_S = 2.0
# After a SIGTERM's cleanup, how long Python's shutdown (joining non-daemon threads, atexit) may
# take before the process exits anyway (`sigterm_raises`).
SIGTERM_EXIT_DEADLINE_S = 30.0
# Signals with which a process ends on its own fault (not sent by a user or the OOM killer).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL,
                           signal.SIGFPE})

_log = logging.getLogger(__name__)


def worker_binary_path() -> pathlib.Path:
    """Path of the C++ worker shipped in the `tensorflow-federated` wheel."""
    path = pathlib.Path(tff.__file__).resolve().parent / "data" / WORKER_BINARY_NAME
    if not path.is_file():
        raise worker_connection.WorkerError(
            f"TFF worker binary not found at {path}; reinstall tensorflow-federated==0.87.0."
        )
    return path


def default_max_concurrent_calls() -> int:
    """How many client computations a local worker runs at once by default: one per CPU core.

    TFF's own default is unlimited: a `federated_map` over n clients runs all n at once, each
    with its own copy of the model's variables and activations, so a worker's memory grows
    linearly with clients per round, and on few cores the n client graphs (each also using
    TensorFlow's intra-op threads) only contend. Measured with `scripts/benchmark.py`
    (docs/PERFORMANCE.md): on 2 cores a 4-layer BERT round of 10 clients × 20 steps took
    11.3–11.6 s with 1 or 2 concurrent calls against 12.0–16.5 s unlimited.
    """
    return max(1, os.cpu_count() or 1)


def worker_command(port: int, max_concurrent_computation_calls: int = -1) -> list[str]:
    """The command line that starts a TFF C++ worker serving on `port` (all interfaces)."""
    return [
        str(worker_binary_path()),
        f"--port={port}",
        f"--max_concurrent_computation_calls={max_concurrent_computation_calls}",
    ]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Asks the Linux kernel to SIGKILL this (child) process when its parent thread exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Not Linux: the atexit/context-manager teardown still applies.


def exit_reason(returncode: int) -> str:
    """How a process ended, from its `returncode`: "killed by SIGKILL", "exited with code 1"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


# Names (comma-separated) of environment variables set for the driver only: a local worker
# starts without them, and without this one (e.g. the system allocator of
# `runner.tensorflow_import`, which the workers' steps hold more with).
DRIVER_ONLY_ENV = "TFFL_DRIVER_ONLY_ENV"


def worker_environment() -> dict[str, str]:
    """The environment a local worker starts with: this process's, without the variables named
    in `DRIVER_ONLY_ENV` nor that one.

    >>> os.environ[DRIVER_ONLY_ENV] = "TFFL_EXAMPLE"; os.environ["TFFL_EXAMPLE"] = "1"
    >>> sorted(k for k in worker_environment() if k in ("TFFL_EXAMPLE", DRIVER_ONLY_ENV))
    []
    >>> del os.environ[DRIVER_ONLY_ENV], os.environ["TFFL_EXAMPLE"]
    """
    dropped = {DRIVER_ONLY_ENV, *filter(None, os.environ.get(DRIVER_ONLY_ENV, "").split(","))}
    return {k: v for k, v in os.environ.items() if k not in dropped}


class LocalWorker(worker_connection.Worker):
    """One TFF C++ worker process on localhost, owned by this Python process.

    The kernel SIGKILLs the worker when the *thread* that launched it exits (`PR_SET_PDEATHSIG`),
    so launch it from a thread that outlives it (normally the main thread).

    Args:
      log_path: where the worker's stdout/stderr go; `None` discards them.
      max_concurrent_computation_calls: passed to the worker: how many calls of one computation
        (e.g. clients of a `federated_map`) run at once; non-positive means unlimited (TFF's
        default). `None`: `default_max_concurrent_calls()`, one per CPU core.
      index: the worker's number in its runtime (0 .. K-1), used in messages.
      port: the port to serve on; `None` picks a free one.
    """

    def __init__(
        self,
        log_path: os.PathLike | str | None = None,
        max_concurrent_computation_calls: int | None = None,
        index: int = 0,
        port: int | None = None,
    ):
        self.log_path = pathlib.Path(log_path) if log_path else None
        if max_concurrent_computation_calls is None:
            max_concurrent_computation_calls = default_max_concurrent_calls()
        self.max_concurrent_computation_calls = max_concurrent_computation_calls
        self.index = index
        self.port: int | None = port
        self.pid: int | None = None
        self.process: subprocess.Popen | None = None
        self._channel: grpc.Channel | None = None
        self.stub: remote_executor_grpc_stub.RemoteExecutorGrpcStub | None = None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def describe(self) -> str:
        log = f"log {self.log_path}" if self.log_path else "log discarded"
        return f"TFF worker #{self.index} (pid {self.pid}, {self.address}, {log})"

    def launch(self) -> "LocalWorker":
        """Starts the worker process without waiting for it to answer (see `wait_ready`)."""
        if self.process is not None:
            raise worker_connection.WorkerError(f"worker at {self.address} was already started")
        if self.port is None:
            self.port = portpicker.pick_unused_port()
        args = worker_command(self.port, self.max_concurrent_computation_calls)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 - closed right after Popen.
        else:
            out = subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if self.log_path is not None else subprocess.DEVNULL,
                close_fds=True,
                env=worker_environment(),
                preexec_fn=_die_with_parent,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.pid = self.process.pid
        _register(self)
        return self

    def wait_ready(self, timeout_s: float, recheck: bool = False) -> None:
        # The channel is opened here, not in `launch`: forking further workers while gRPC threads
        # are busy makes gRPC print "skipping fork() handlers" to our stderr.
        if self._channel is None and self.process is not None:
            self._open_channel()
        super().wait_ready(timeout_s, recheck)

    def start(self, ready_timeout_s: float = worker_connection.DEFAULT_READY_TIMEOUT_S
              ) -> "LocalWorker":
        """Starts the worker and blocks until it answers, or raises `WorkerError` (and stops
        it)."""
        self.launch()
        self._ready_or_stop(ready_timeout_s)
        return self

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def crashed(self) -> bool:
        """Whether the process ended on its own fault: killed by one of `CRASH_SIGNALS`."""
        process = self.process
        return process is not None and process.poll() is not None and (
            -process.returncode in CRASH_SIGNALS)

    def restart(self, ready_timeout_s: float = worker_connection.DEFAULT_READY_TIMEOUT_S
                ) -> "LocalWorker":
        """Replaces an ended process with a new one on a new port (`generation` + 1) and waits
        until it answers. Call it from the thread that launched the first one (see the class)."""
        self.stop()
        self.port = None
        self.generation += 1
        return self.start(ready_timeout_s)

    def check_running(self) -> None:
        process = self.process
        if process is None:
            raise worker_connection.WorkerError(
                f"{self.describe()} is not running (it was stopped)")
        if process.poll() is not None:
            raise worker_connection.WorkerError(
                f"{self.describe()} {exit_reason(process.returncode)}")

    def raise_if_lost(self, error: grpc.RpcError, timeout_s: float) -> None:
        # The RPC can fail a moment before the kernel reports the process's exit.
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_EXIT_GRACE_S)
        try:
            super().raise_if_lost(error, timeout_s)
        except worker_connection.WorkerError as e:
            raise worker_connection.WorkerError(f"{e} while running a computation") from error

    def stop(self, grace_s: float = 5.0) -> None:
        """Stops the worker: SIGINT, then SIGKILL if it has not exited after `grace_s`."""
        self._close_channel()
        process, self.process = self.process, None
        if process is None:
            return
        _unregister(self)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# Every worker this process started and has not stopped yet; `atexit` stops any left over.
_LIVE_WORKERS: list[LocalWorker] = []
_LIVE_LOCK = threading.Lock()


def _register(worker: LocalWorker) -> None:
    with _LIVE_LOCK:
        _LIVE_WORKERS.append(worker)


def _unregister(worker: LocalWorker) -> None:
    with _LIVE_LOCK:
        if worker in _LIVE_WORKERS:
            _LIVE_WORKERS.remove(worker)


def live_worker_pids() -> list[int]:
    """PIDs of the workers this process started and has not stopped (alive or not)."""
    with _LIVE_LOCK:
        return [w.pid for w in _LIVE_WORKERS if getattr(w, "pid", None) is not None]


def stop_all_workers() -> None:
    """Stops every worker this process started, and any stray `worker_binary` children
    (for example one that TFF's own default context started)."""
    with _LIVE_LOCK:
        workers = list(_LIVE_WORKERS)
    for worker in workers:
        worker.stop()
    for pid in running_workers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def at_exit() -> None:
    """This process's TFF teardown: `stop_all_workers`, then TFF's default context dropped
    (registered with `atexit` here and by `tffl`'s package; running it twice is harmless)."""
    stop_all_workers()
    # Drop TFF's import-time default context while modules are still alive: its worker manager's
    # `__del__` otherwise runs during interpreter teardown and prints a spurious traceback.
    with contextlib.suppress(Exception):
        from tffl.runtime.tff_internals import runtime_error_context

        context_stack_impl.context_stack.set_default_context(
            runtime_error_context.RuntimeErrorContext()
        )


atexit.register(at_exit)


def running_workers(parent_pid: int | None = None) -> list[int]:
    """PIDs of live `worker_binary` processes that are children of `parent_pid` (default: us).

    With `parent_pid=0`, every `worker_binary` process on the machine.
    """
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        info = proc.info
        cmdline = info.get("cmdline") or []
        if not cmdline or not cmdline[0].endswith(WORKER_BINARY_NAME):
            continue
        if info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if parent_pid == 0 or info["ppid"] == (os.getpid() if parent_pid is None else parent_pid):
            found.append(info["pid"])
    return found


_EXIT_SCHEDULED = False  # `_exit_after` was called: a later call leaves the first deadline


def _exit_after(seconds: float, status: int) -> None:
    """Ends the process with `status` in `seconds` if it is still alive then: a daemon thread's
    `os._exit`. A SIGTERMed run must end although a library left a non-daemon thread blocked
    (Python's shutdown joins every one of them, so one blocked thread keeps the process alive,
    orphaned, after its parent has given up waiting)."""

    global _EXIT_SCHEDULED
    with _LIVE_LOCK:
        if _EXIT_SCHEDULED:
            return
        _EXIT_SCHEDULED = True

    def exit_later():
        time.sleep(seconds)
        sys.stderr.write(f"tffl: still alive {seconds:g} s after SIGTERM (a thread did not end); "
                         "exiting now.\n")
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=exit_later, name="tffl-sigterm-deadline", daemon=True).start()


class _Terminated(BaseException):
    """Raised in the main thread by our SIGTERM handler so that `finally` blocks run."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turns SIGTERM into an exception (main thread only), restoring the old handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    # One raise: a second SIGTERM (a process manager and the parent-death signal often both send
    # one) must not interrupt the cleanup the first one started. Raised inside gRPC's
    # `Channel.close`, it leaves the channel half-closed, and the garbage collector's later
    # close of it waits forever (a hang seen under `reproduce.py`). It starts the exit deadline
    # instead, so a first exception that was swallowed (in a finalizer or a callback) or a hung
    # cleanup still ends the process.
    terminating = []

    def handler(signum, frame):
        if terminating:
            sys.stderr.write(f"tffl: signal {signum} again; already stopping (exiting within "
                             f"{SIGTERM_EXIT_DEADLINE_S:g} s).\n")
            _exit_after(SIGTERM_EXIT_DEADLINE_S, 128 + signum)
            return
        terminating.append(signum)
        raise _Terminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        # Leave with the conventional status of a SIGTERM death (128 + 15), after cleanup ran.
        sys.stderr.write("tffl: terminated (SIGTERM); TFF workers stopped.\n")
        sys.stderr.flush()
        _exit_after(SIGTERM_EXIT_DEADLINE_S, 128 + signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


