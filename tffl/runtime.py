"""The one place that creates, selects and tears down TFF execution contexts.

TFF's default context (installed when `tensorflow_federated` is imported) starts its C++
`worker_binary` as a child process on first use. That child inherits the caller's stdout/stderr
and is only stopped by a `__del__` that fails at interpreter shutdown, so it *outlives Python* and
keeps the caller's pipes open: a test run or `script | tee` then hangs forever.

This module starts the worker itself, so that it

- writes to a log file (or /dev/null), never to inherited pipes;
- is killed by the kernel if this Python process dies for any reason, SIGKILL included
  (`PR_SET_PDEATHSIG` on Linux);
- is stopped (SIGINT, then SIGKILL after a grace period) when the `local_runtime()` block exits
  normally, by an exception, or by SIGINT/SIGTERM, and by an `atexit` hook as a last resort;

and builds TFF's own synchronous execution context on top of it (the same compiler pipeline and
remote executor `tff.backends.native.create_sync_local_cpp_execution_context` uses).

Example:

>>> from tffl import runtime
>>> with runtime.local_runtime():
...     result = my_federated_computation(values)   # runs on a managed worker
>>> runtime.running_workers()
[]
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
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
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation,
)
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import placements

WORKER_BINARY_NAME = "worker_binary"
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1


class WorkerError(RuntimeError):
    """A TFF worker could not be started, did not become ready, or died."""


def worker_binary_path() -> pathlib.Path:
    """Path of the C++ worker shipped in the `tensorflow-federated` wheel."""
    path = pathlib.Path(tff.__file__).resolve().parent / "data" / WORKER_BINARY_NAME
    if not path.is_file():
        raise WorkerError(
            f"TFF worker binary not found at {path}; reinstall tensorflow-federated==0.87.0."
        )
    return path


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Asks the Linux kernel to SIGKILL this (child) process when its parent thread exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Not Linux: the atexit/context-manager teardown still applies.


class LocalWorker:
    """One TFF C++ worker process on localhost, owned by this Python process.

    Args:
      log_path: where the worker's stdout/stderr go; `None` discards them.
      max_concurrent_computation_calls: passed to the worker; non-positive means unlimited.
    """

    def __init__(
        self,
        log_path: os.PathLike | str | None = None,
        max_concurrent_computation_calls: int = -1,
    ):
        self.log_path = pathlib.Path(log_path) if log_path else None
        self.max_concurrent_computation_calls = max_concurrent_computation_calls
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self._channel: grpc.Channel | None = None
        self.stub: remote_executor_grpc_stub.RemoteExecutorGrpcStub | None = None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def start(self, ready_timeout_s: float = 60.0) -> "LocalWorker":
        """Starts the worker and blocks until it answers, or raises `WorkerError`."""
        if self.process is not None:
            raise WorkerError(f"worker at {self.address} was already started")
        self.port = portpicker.pick_unused_port()
        args = [
            str(worker_binary_path()),
            f"--port={self.port}",
            f"--max_concurrent_computation_calls={self.max_concurrent_computation_calls}",
        ]
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
                preexec_fn=_die_with_parent,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        _register(self)
        self._channel = grpc.insecure_channel(self.address, _GRPC_OPTIONS)
        self.stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(self._channel)
        deadline = time.monotonic() + ready_timeout_s
        while not self.stub.is_ready:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise WorkerError(
                    f"TFF worker on {self.address} exited with code {code} before it was ready"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerError(
                    f"TFF worker on {self.address} was not ready after {ready_timeout_s:.0f} s"
                )
            time.sleep(0.05)
        return self

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stops the worker: SIGINT, then SIGKILL if it has not exited after `grace_s`."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
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


def _at_exit() -> None:
    stop_all_workers()
    # Drop TFF's import-time default context while modules are still alive: its worker manager's
    # `__del__` otherwise runs during interpreter teardown and prints a spurious traceback.
    with contextlib.suppress(Exception):
        from tensorflow_federated.python.core.impl.context_stack import runtime_error_context

        context_stack_impl.context_stack.set_default_context(
            runtime_error_context.RuntimeErrorContext()
        )


atexit.register(_at_exit)


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


def create_worker_context(
    worker: LocalWorker, default_num_clients: int = 0
) -> sync_execution_context.SyncExecutionContext:
    """TFF's synchronous execution context executing on an already started `worker`."""

    def stack_fn(cardinalities):
        if worker.stub is None or not worker.is_alive():
            raise WorkerError(
                f"TFF worker on {worker.address} is not running (it died or was stopped)"
            )
        if cardinalities.get(placements.CLIENTS) is None:
            cardinalities[placements.CLIENTS] = default_num_clients
        executor = remote_executor.RemoteExecutor(worker.stub)
        executor.set_cardinalities(cardinalities)
        return executor

    return sync_execution_context.SyncExecutionContext(
        executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(stack_fn),
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


class _Terminated(BaseException):
    """Raised in the main thread by our SIGTERM handler so that `finally` blocks run."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turns SIGTERM into an exception (main thread only), restoring the old handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        # Leave with the conventional status of a SIGTERM death (128 + 15), after cleanup ran.
        sys.stderr.write("tffl: terminated (SIGTERM); TFF worker stopped.\n")
        sys.stderr.flush()
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def local_runtime(
    log_dir: os.PathLike | str | None = None,
    ready_timeout_s: float = 60.0,
    default_num_clients: int = 0,
) -> Iterator[sync_execution_context.SyncExecutionContext]:
    """Runs the enclosed block on a managed local TFF C++ worker, and always stops it.

    The context is installed on top of TFF's context stack for the calling thread and popped on
    exit, so code outside the block (and TFF pipelines that set their own default context) is
    untouched.

    Args:
      log_dir: directory for the worker's log (`tff_worker.log`); `None` discards its output.
      ready_timeout_s: how long to wait for the worker to answer before raising `WorkerError`.
      default_num_clients: CLIENTS cardinality used when a computation cannot infer it.

    Yields:
      The installed `SyncExecutionContext`.
    """
    log_path = pathlib.Path(log_dir) / "tff_worker.log" if log_dir else None
    worker = LocalWorker(log_path=log_path)
    with _sigterm_raises():
        try:
            worker.start(ready_timeout_s=ready_timeout_s)
            context = create_worker_context(worker, default_num_clients=default_num_clients)
            with context_stack_impl.context_stack.install(context):
                yield context
        finally:
            worker.stop()
