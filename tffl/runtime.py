"""The one place that creates, selects and tears down TFF execution contexts.

TFF's default context (installed when `tensorflow_federated` is imported) starts its C++
`worker_binary` as a child process on first use. That child inherits the caller's stdout/stderr
and is only stopped by a `__del__` that fails at interpreter shutdown, so it *outlives Python* and
keeps the caller's pipes open: a test run or `script | tee` then hangs forever.

This module starts the workers itself, so that each

- writes to a log file (or /dev/null), never to inherited pipes;
- is killed by the kernel if this Python process dies for any reason, SIGKILL included
  (`PR_SET_PDEATHSIG` on Linux);
- is stopped (SIGINT, then SIGKILL after a grace period) when the `local_runtime()` block exits
  normally, by an exception, or by SIGINT/SIGTERM, and by an `atexit` hook as a last resort;

and builds TFF's own execution contexts on top of them:

- one worker (`local_runtime()`, or `remote_runtime([address])`): TFF's synchronous context (the
  compiler pipeline and remote executor of
  `tff.backends.native.create_sync_local_cpp_execution_context`) on that worker;
- K workers (`local_runtime(num_workers=K)`, or `remote_runtime([address, ...])` with workers
  started elsewhere, e.g. by `scripts/start_worker.py`): `MultiWorkerContext`, TFF's
  mergeable-computation machinery with one asynchronous remote context per worker. A computation
  whose argument holds CLIENTS-placed values is compiled by TFF's `mergeable_comp_compiler` to
  (up_to_merge, merge, after_merge); the clients are cut into K contiguous groups, each worker runs
  `up_to_merge` on its group, the partial aggregates are merged and `after_merge` runs once (on
  every group if the result holds CLIENTS-placed values), as TFF's `MergeableCompExecutionContext`
  runs it, with two of its TFF 0.87 bugs avoided (see `split_clients`, `MultiWorkerContext`) and
  the workers' RPCs run in threads so that they compute together. TFF's compiler takes one layer
  of aggregations
  only; a computation with an aggregation that consumes another's result (linear FLUTE's `next`:
  the heads step with the head Gram matrix aggregated and broadcast back; or a B and an A round
  of RoLoRA chained in one computation) is first cut into stages at each layer of
  aggregations (`split_at_aggregation_layers`), each compiled and split the same way, and the
  stages run in order. A computation without CLIENTS-placed arguments (initialize,
  get_model_weights, ...), or one that cannot be compiled (see `MultiWorkerContext.unsplit`), runs
  whole on worker 0. Results equal a single worker's up to float rounding (sums in another order).

Faults: when a worker dies, or stops answering, the computation raises `WorkerError` naming the
worker (its number, pid or address and log file) instead of TFF's endless retries of a gRPC
`UNAVAILABLE`; a worker that is not ready within `ready_timeout_s` raises `WorkerError` too.
`tffl.simulation.run_rounds` has checkpointed every completed round by then, so the run continues
with `resume=True` (`scripts/train.py --resume`). See docs/runtime.md.

Devices: the C++ worker pins every TensorFlow session it creates round-robin to the GPUs (or
TPUs) it sees (TFF's `SessionProvider`), with soft placement; there is no worker flag for it. The
`worker_binary` of the tensorflow-federated 0.87.0 wheel is built without CUDA, so it runs on CPU.

Example:

>>> from tffl import runtime
>>> with runtime.local_runtime(num_workers=2):
...     result = my_federated_computation(values)   # clients split over two managed workers
>>> runtime.running_workers()
[]
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import logging
import math
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.common_libs import async_utils
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_backend import (
    tensorflow_tree_transformations,
)
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation,
)
from tensorflow_federated.python.core.impl.compiler import building_block_factory
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import transformation_utils
from tensorflow_federated.python.core.impl.compiler import transformations
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_base
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context,
)
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.executors import remote_executor_stub
from tensorflow_federated.python.core.impl.executors import value_serialization
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions

WORKER_BINARY_NAME = "worker_binary"
DEFAULT_READY_TIMEOUT_S = 60.0
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1
# After an RPC fails, how long a local worker may take to be seen as exited.
_EXIT_GRACE_S = 2.0

_log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """A TFF worker could not be started, did not become ready, or died / stopped answering."""


def worker_binary_path() -> pathlib.Path:
    """Path of the C++ worker shipped in the `tensorflow-federated` wheel."""
    path = pathlib.Path(tff.__file__).resolve().parent / "data" / WORKER_BINARY_NAME
    if not path.is_file():
        raise WorkerError(
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


class _Worker:
    """What the contexts need from a worker: a gRPC channel, readiness and fault checks."""

    address: str
    _channel: grpc.Channel | None = None
    # TFF's gRPC stub on `_channel`, one per worker: each stub subscribes to the channel's state.
    stub: remote_executor_grpc_stub.RemoteExecutorGrpcStub | None = None

    def _open_channel(self) -> None:
        self._channel = grpc.insecure_channel(self.address, _GRPC_OPTIONS)
        self.stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(self._channel)

    def _close_channel(self) -> None:
        channel, self._channel, self.stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def describe(self) -> str:
        raise NotImplementedError

    def check_running(self) -> None:
        """Raises `WorkerError` if the worker is known to be gone (no-op if unknown)."""

    def wait_ready(self, timeout_s: float, recheck: bool = False) -> None:
        """Blocks until the worker answers on gRPC, or raises `WorkerError` after `timeout_s`.

        Returns at once if the channel was last seen ready, unless `recheck`."""
        if self._channel is None:
            raise WorkerError(f"{self.describe()} is not running (it was stopped)")
        self.check_running()
        if not recheck and self.stub is not None and self.stub.is_ready:
            return
        deadline = time.monotonic() + timeout_s
        future = grpc.channel_ready_future(self._channel)
        try:
            while True:
                self.check_running()
                try:
                    future.result(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                    return
                except grpc.FutureTimeoutError:
                    if time.monotonic() >= deadline:
                        raise WorkerError(
                            f"{self.describe()} was not ready after {timeout_s:.0f} s"
                            + self._not_ready_hint()
                        ) from None
        finally:
            future.cancel()

    def _not_ready_hint(self) -> str:
        return ""

    def raise_if_lost(self, error: grpc.RpcError, timeout_s: float) -> None:
        """After a failed RPC: raises `WorkerError` (from `error`) if the worker died, or does not
        answer again within `timeout_s`; returns if it is alive and answering (the RPC's error is
        then the computation's own, or a transient one TFF retries)."""
        self.check_running()
        code = error.code() if isinstance(error, grpc.Call) else None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, None):
            try:
                self.wait_ready(timeout_s, recheck=True)
            except WorkerError:
                details = error.details() if isinstance(error, grpc.Call) else str(error)
                raise WorkerError(
                    f"{self.describe()} stopped answering ({code.name if code else 'no code'}: "
                    f"{details}) and was not ready again after {timeout_s:.0f} s"
                    + self._not_ready_hint()
                ) from error

    def stop(self) -> None:
        raise NotImplementedError


class LocalWorker(_Worker):
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
            raise WorkerError(f"worker at {self.address} was already started")
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

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> "LocalWorker":
        """Starts the worker and blocks until it answers, or raises `WorkerError` (and stops it)."""
        self.launch()
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_running(self) -> None:
        process = self.process
        if process is None:
            raise WorkerError(f"{self.describe()} is not running (it was stopped)")
        if process.poll() is not None:
            raise WorkerError(f"{self.describe()} {exit_reason(process.returncode)}")

    def raise_if_lost(self, error: grpc.RpcError, timeout_s: float) -> None:
        # The RPC can fail a moment before the kernel reports the process's exit.
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_EXIT_GRACE_S)
        try:
            super().raise_if_lost(error, timeout_s)
        except WorkerError as e:
            raise WorkerError(f"{e} while running a computation") from error

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


class RemoteWorker(_Worker):
    """A TFF C++ worker started elsewhere (e.g. `scripts/start_worker.py` on another host), known
    by its `host:port`; this process only connects to it and never stops it.

    Args:
      address: `host:port` of the worker.
      index: the worker's number in its runtime (0 .. K-1), used in messages.
    """

    def __init__(self, address: str, index: int = 0):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise WorkerError(f"TFF worker address {address!r} must be host:port")
        self.address = f"{host}:{port}"
        self.index = index
        self._channel: grpc.Channel | None = None

    def describe(self) -> str:
        return f"TFF worker #{self.index} at {self.address}"

    def _not_ready_hint(self) -> str:
        return (
            f"; is a worker running there (scripts/start_worker.py --port="
            f"{self.address.rpartition(':')[2]}) and reachable from this host?"
        )

    def connect(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> "RemoteWorker":
        """Opens the channel and blocks until the worker answers, or raises `WorkerError`."""
        if self._channel is None:
            self._open_channel()
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Closes the connection (the remote worker keeps running)."""
        self._close_channel()


class _GuardedStub(remote_executor_stub.RemoteExecutorStub):
    """TFF's gRPC stub for one worker, turning the RPC errors of a lost worker into `WorkerError`.

    Without this, TFF retries a gRPC `UNAVAILABLE` forever (it is a `RetryableError`), so a dead
    worker hangs the run. `WorkerError` is not retryable: it ends the computation.
    """

    def __init__(self, worker: _Worker, timeout_s: float):
        if worker.stub is None:
            raise WorkerError(f"{worker.describe()} is not running (it was stopped)")
        self._worker = worker
        self._timeout_s = timeout_s
        self._stub = worker.stub

    def _call(self, name: str, request):
        try:
            return getattr(self._stub, name)(request)
        except grpc.RpcError as e:
            self._worker.raise_if_lost(e, self._timeout_s)
            raise

    def _dispose_call(self, name: str, request, empty):
        # Called from finalizers too: after the worker is gone there is nothing left to free.
        try:
            return getattr(self._stub, name)(request)
        except grpc.RpcError:
            try:
                self._worker.check_running()
            except WorkerError:
                return empty
            raise

    def get_executor(self, request):
        return self._call("get_executor", request)

    def create_value(self, request):
        return self._call("create_value", request)

    def create_struct(self, request):
        return self._call("create_struct", request)

    def create_call(self, request):
        return self._call("create_call", request)

    def create_selection(self, request):
        return self._call("create_selection", request)

    def compute(self, request):
        return self._call("compute", request)

    def dispose(self, request):
        return self._dispose_call("dispose", request, executor_pb2.DisposeResponse())

    def dispose_executor(self, request):
        return self._dispose_call(
            "dispose_executor", request, executor_pb2.DisposeExecutorResponse()
        )

    @property
    def is_ready(self) -> bool:
        return self._stub.is_ready


async def _in_daemon_thread(fn, *args):
    """Awaits `fn(*args)` run in a new daemon thread (never blocks interpreter exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error):
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def run():
        try:
            result, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the event loop was closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, daemon=True, name="tffl-compute").start()
    return await future


class _WorkerExecutor(remote_executor.RemoteExecutor):
    """TFF's `RemoteExecutor` whose slow RPCs run in a thread, off the event loop.

    TFF's remote executor makes synchronous gRPC calls inside coroutines, and the C++ worker's
    `CreateCall` returns only when the call is computed. With one event loop driving all workers
    (the mergeable context), worker 1 would not start until worker 0 had finished. Running
    `CreateValue`, `CreateCall` and `Compute` in threads lets the workers compute together.
    """

    async def create_value(self, value, type_spec=None):
        self._check_has_executor_id()
        value_proto, type_spec = value_serialization.serialize_value(value, type_spec)
        request = executor_pb2.CreateValueRequest(executor=self._executor_id, value=value_proto)
        response = await _in_daemon_thread(self._stub.create_value, request)
        return remote_executor.RemoteValue(response.value_ref, type_spec, self)

    async def create_call(self, comp, arg=None):
        self._check_has_executor_id()
        request = executor_pb2.CreateCallRequest(
            executor=self._executor_id,
            function_ref=comp.reference,
            argument_ref=(arg.reference if arg is not None else None),
        )
        response = await _in_daemon_thread(self._stub.create_call, request)
        return remote_executor.RemoteValue(response.value_ref, comp.type_signature.result, self)

    async def _compute(self, value_ref, type_spec):
        self._check_has_executor_id()
        request = executor_pb2.ComputeRequest(executor=self._executor_id, value_ref=value_ref)
        response = await _in_daemon_thread(self._stub.compute, request)
        value, _ = value_serialization.deserialize_value(response.value, type_spec)
        return value


def _executor_factory(
    worker: _Worker, default_num_clients: int, timeout_s: float, threaded: bool = False
) -> python_executor_stacks.ResourceManagingExecutorFactory:
    """TFF's executor factory over one worker; checks the worker before each new executor.

    The executors are TFF's `RemoteExecutor`, or with `threaded` `_WorkerExecutor` (for several
    workers driven by one event loop)."""
    executor_class = _WorkerExecutor if threaded else remote_executor.RemoteExecutor

    def stack_fn(cardinalities):
        worker.wait_ready(timeout_s)  # raises WorkerError if it died or does not answer
        if cardinalities.get(placements.CLIENTS) is None:
            cardinalities[placements.CLIENTS] = default_num_clients
        executor = executor_class(_GuardedStub(worker, timeout_s))
        executor.set_cardinalities(cardinalities)
        return executor

    return python_executor_stacks.ResourceManagingExecutorFactory(stack_fn)


def create_worker_context(
    worker: _Worker,
    default_num_clients: int = 0,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> sync_execution_context.SyncExecutionContext:
    """TFF's synchronous execution context executing on an already started `worker`."""
    return sync_execution_context.SyncExecutionContext(
        executor_fn=_executor_factory(worker, default_num_clients, ready_timeout_s),
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


def _create_async_worker_context(
    worker: _Worker, default_num_clients: int, ready_timeout_s: float
) -> async_execution_context.AsyncExecutionContext:
    """TFF's asynchronous execution context on one worker (what the mergeable context drives)."""
    return async_execution_context.AsyncExecutionContext(
        executor_fn=_executor_factory(worker, default_num_clients, ready_timeout_s, threaded=True),
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


# --- Splitting computations with several layers of aggregations --------------------------------


def _is_aggregation(value: building_blocks.ComputationBuildingBlock) -> bool:
    return (
        isinstance(value, building_blocks.Call)
        and isinstance(value.function, building_blocks.Intrinsic)
        and bool(value.function.intrinsic_def().aggregation_kind)
    )


def _free_names(value: building_blocks.ComputationBuildingBlock) -> set[str]:
    return transformation_utils.get_map_of_unbound_references(value)[value]


def _closure(bindings: Sequence[tuple[str, object]], roots: set[str]) -> set[str]:
    """Names of `bindings` that `roots` need, directly or through other bindings."""
    uses = {name: _free_names(value) for name, value in bindings}
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in uses and name not in needed:
            needed.add(name)
            todo.extend(uses[name])
    return needed


def _call_dominant(comp: computation_impl.ConcreteComputation) -> building_blocks.Lambda:
    """`comp` as the call-dominant lambda TFF's mergeable compiler works on: intrinsics lowered
    (e.g. `federated_mean` to `federated_aggregate`), one block of bindings under the lambda."""
    lam = mergeable_comp_compiler._ensure_lambda(comp.to_building_block())  # noqa: SLF001
    lowered, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(lam)
    return building_blocks.Lambda(
        lowered.parameter_name,
        lowered.parameter_type,
        transformations.to_call_dominant(lowered.result),
    )


def split_at_aggregation_layers(
    lam: building_blocks.Lambda,
) -> list[building_blocks.Lambda]:
    """Cuts a call-dominant lambda into stages with one layer of aggregations each.

    The first layer = the aggregations that consume no aggregation's result. Stage 1 computes
    them from the argument `x` and returns them (`<a_1, ..., a_n>`, all SERVER-placed); stage 2
    takes `<x, <a_1, ..., a_n>>` and computes the rest, with the bindings it needs from before
    the layer (e.g. broadcasts of the argument) recomputed and unneeded ones dropped; stage 2 is
    cut again if it still has dependent aggregations. Running the stages in order, each fed the
    original argument and the previous stage's result, computes `lam`. A lambda whose
    aggregations are all independent (or without parameter) comes back as the single stage.
    """
    body = lam.result
    if lam.parameter_name is None or not isinstance(body, building_blocks.Block):
        return [lam]
    bindings = list(body.locals)
    after_aggregation: dict[str, bool] = {}
    first_layer: list[str] = []
    dependent = False
    for name, value in bindings:
        consumes = any(after_aggregation.get(n, False) for n in _free_names(value))
        if _is_aggregation(value):
            if consumes:
                dependent = True
            else:
                first_layer.append(name)
        after_aggregation[name] = consumes or _is_aggregation(value)
    if not dependent:
        return [lam]

    types = {name: value.type_signature for name, value in bindings}
    stage1_needs = _closure(bindings, set(first_layer))
    stage1_result = building_blocks.Struct(
        [building_blocks.Reference(n, types[n]) for n in first_layer]
    )
    stage1 = building_blocks.Lambda(
        lam.parameter_name,
        lam.parameter_type,
        building_blocks.Block(
            [(n, v) for n, v in bindings if n in stage1_needs], stage1_result
        ),
    )

    parameter = next(building_block_factory.unique_name_generator(lam))
    parameter_type = computation_types.StructType(
        [lam.parameter_type, stage1_result.type_signature]
    )
    ref = building_blocks.Reference(parameter, parameter_type)
    results = building_blocks.Selection(ref, index=1)
    rebound = [(lam.parameter_name, building_blocks.Selection(ref, index=0))]
    rebound += [
        (n, building_blocks.Selection(results, index=i)) for i, n in enumerate(first_layer)
    ]
    rest = rebound + [(n, v) for n, v in bindings if n not in first_layer]
    stage2_needs = _closure(rest, _free_names(body.result))
    stage2 = building_blocks.Lambda(
        parameter,
        parameter_type,
        building_blocks.Block([(n, v) for n, v in rest if n in stage2_needs], body.result),
    )
    return [stage1, *split_at_aggregation_layers(stage2)]


def compile_to_mergeable_stages(
    comp: computation_impl.ConcreteComputation,
) -> list[mergeable_comp_execution_context.MergeableCompForm]:
    """`comp` as a list of TFF `MergeableCompForm`s run in order (see `MultiWorkerContext`).

    One form (TFF's `compile_to_mergeable_comp_form` on `comp` itself) when its aggregations are
    independent; else one per stage of `split_at_aggregation_layers`, the last one typed with
    `comp`'s result type (so results keep their Python containers).

    Raises:
      Whatever TFF's compiler raises for a computation it cannot express in mergeable form.
    """
    lam = _call_dominant(comp)
    stages = split_at_aggregation_layers(lam)
    if len(stages) == 1:
        return [mergeable_comp_compiler.compile_to_mergeable_comp_form(comp)]
    forms = []
    for k, stage in enumerate(stages):
        stage_comp = computation_impl.ConcreteComputation(
            computation_proto=stage.proto, context_stack=context_stack_impl.context_stack
        )
        if k == len(stages) - 1:
            stage_comp = computation_impl.ConcreteComputation.with_type(
                stage_comp,
                computation_types.FunctionType(
                    stage_comp.type_signature.parameter, comp.type_signature.result
                ),
            )
        forms.append(mergeable_comp_compiler.compile_to_mergeable_comp_form(stage_comp))
    return forms


def _has_clients_values(type_spec: computation_types.Type | None) -> bool:
    if type_spec is None:
        return False
    return type_analysis.contains(
        type_spec,
        lambda t: isinstance(t, computation_types.FederatedType)
        and t.placement is placements.CLIENTS
        and not t.all_equal,
    )


def split_clients(value, type_spec: computation_types.Type, num_parts: int) -> list:
    """`value` (of type `type_spec`) cut into at most `num_parts` values with contiguous groups of
    its clients, as TFF's mergeable context cuts them (group i has ceil(remaining / parts left)
    clients); every CLIENTS-placed (not all-equal) value is sliced alike, the rest is repeated.

    TFF 0.87's own `_split_value_into_subrounds` gets this wrong when the last element of a struct
    is not CLIENTS-placed (e.g. `<<state, data>, server_result>`): its clients counter does not
    advance and every group gets the same first clients.
    """
    n = cardinalities_utils.infer_cardinalities(value, type_spec).get(placements.CLIENTS)
    if not n:
        return [value]
    bounds, low = [], 0
    for parts_left in range(num_parts, 0, -1):
        size = math.ceil((n - low) / parts_left)
        if size == 0:
            break
        bounds.append((low, low + size))
        low += size
    return [_slice_clients(value, type_spec, low, high) for low, high in bounds]


def _slice_clients(value, type_spec: computation_types.Type, low: int, high: int):
    if isinstance(type_spec, computation_types.StructType):
        elements = structure.iter_elements(structure.from_container(value))
        return structure.Struct([
            (name, _slice_clients(element, element_type, low, high))
            for (_, element), (name, element_type) in zip(
                elements, structure.iter_elements(type_spec)
            )
        ])
    if (
        isinstance(type_spec, computation_types.FederatedType)
        and type_spec.placement is placements.CLIENTS
        and not type_spec.all_equal
    ):
        return list(value)[low:high]
    return value


class MultiWorkerContext(context_base.SyncContext):
    """Runs computations on K workers, splitting their clients with TFF's mergeable machinery.

    A computation whose argument holds CLIENTS-placed values is compiled once to the stages of
    `compile_to_mergeable_stages`. Each stage runs as TFF's `MergeableCompExecutionContext` runs
    a `MergeableCompForm` (its `_invoke_mergeable_comp_form`, one asynchronous remote context per
    worker): the argument is cut into K contiguous client groups (`split_clients`), worker i runs
    `up_to_merge` on group i, the partial aggregates are merged as they arrive, and `after_merge`
    runs on one worker (or on every group, for CLIENTS-placed results, concatenated). Stage k > 1
    gets `<argument, result of stage k - 1>`. Other computations, and those TFF cannot compile to
    mergeable form, run whole on worker 0; the names and reasons of the latter are in `unsplit`.

    Args:
      workers: started workers (`LocalWorker` or connected `RemoteWorker`).
      default_num_clients: CLIENTS cardinality used when a computation cannot infer it.
      ready_timeout_s: how long a worker may take to answer again before `WorkerError`.
    """

    def __init__(
        self,
        workers: Sequence[_Worker],
        default_num_clients: int = 0,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ):
        if not workers:
            raise ValueError("MultiWorkerContext needs at least one worker")
        self.workers = list(workers)
        self.whole = create_worker_context(workers[0], default_num_clients, ready_timeout_s)
        self.async_contexts = [
            _create_async_worker_context(w, default_num_clients, ready_timeout_s)
            for w in workers
        ]
        self._runner = async_utils.AsyncThreadRunner()
        self.unsplit: dict[str, str] = {}
        # id(comp) -> (comp, stages or None); holding comp keeps its id unique.
        self._compiled: dict[int, tuple[object, list | None]] = {}
        self._lock = threading.Lock()

    def _stages(self, comp) -> list | None:
        with self._lock:
            found = self._compiled.get(id(comp))
            if found is not None and found[0] is comp:
                return found[1]
            try:
                stages = compile_to_mergeable_stages(comp)
            except Exception as e:  # noqa: BLE001 - any compiler failure: run it whole
                name = getattr(comp, "name", None) or str(comp.type_signature)
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                self.unsplit[name] = reason
                _log.warning("tffl.runtime: %s runs on one worker (not split): %s", name, reason)
                stages = None
            self._compiled[id(comp)] = (comp, stages)
            return stages

    def run_stage(self, form: mergeable_comp_execution_context.MergeableCompForm, arg):
        """One `MergeableCompForm` on `arg`, its clients split across the workers."""
        parts = split_clients(arg, form.up_to_merge.type_signature.parameter, len(self.workers))
        result = self._runner.run_coro_and_return_result(self._run_form(form, parts))
        return type_conversions.type_to_py_container(
            result, form.after_merge.type_signature.result
        )

    async def _run_form(self, form, parts):
        tff_pool = mergeable_comp_execution_context  # TFF's (private) mergeable execution steps
        try:
            # up_to_merge on each group (group i on worker i), partial results merged as they come.
            merged, merge_context = await tff_pool._invoke_merge_in_async_pool(  # noqa: SLF001
                form, parts, self.async_contexts
            )
            result_type = form.after_merge.type_signature.result
            if not _has_clients_values(result_type):
                return await tff_pool._compute_after_merged(  # noqa: SLF001
                    form, parts[0], merged, merge_context
                )
            # CLIENTS-placed results: after_merge on every group, concatenated in group order.
            # (TFF's `_invoke_after_merge_in_async_pool` concatenates in completion order, which
            # hands clients each other's values.)
            results = await asyncio.gather(*[
                tff_pool._compute_after_merged(form, part, merged, context)  # noqa: SLF001
                for part, context in zip(parts, self.async_contexts)
            ])
            repackage = tff_pool._repackage_partitioned_values  # noqa: SLF001
            return repackage(list(results), result_type)
        except BaseException:
            # Stop the other groups' tasks so they do not fail later unobserved ("Task exception
            # was never retrieved").
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            raise

    def invoke(self, comp, arg):
        if arg is None or not isinstance(comp, computation_impl.ConcreteComputation) or (
            not _has_clients_values(comp.type_signature.parameter)
        ):
            return self.whole.invoke(comp, arg)
        stages = self._stages(comp)
        if stages is None:
            return self.whole.invoke(comp, arg)
        result = None
        for k, form in enumerate(stages):
            result = self.run_stage(form, arg if k == 0 else structure.Struct.unnamed(arg, result))
        return tensorflow_computation.transform_result(result)


# --- Process bookkeeping -----------------------------------------------------------------------

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
        sys.stderr.write("tffl: terminated (SIGTERM); TFF workers stopped.\n")
        sys.stderr.flush()
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _create_context(workers, default_num_clients, ready_timeout_s) -> context_base.SyncContext:
    if len(workers) == 1:
        return create_worker_context(workers[0], default_num_clients, ready_timeout_s)
    return MultiWorkerContext(workers, default_num_clients, ready_timeout_s)


@contextlib.contextmanager
def _installed(context: context_base.SyncContext) -> Iterator[context_base.SyncContext]:
    with context_stack_impl.context_stack.install(context):
        yield context


@contextlib.contextmanager
def local_runtime(
    log_dir: os.PathLike | str | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    default_num_clients: int = 0,
    num_workers: int = 1,
    max_concurrent_calls: int | None = None,
) -> Iterator[context_base.SyncContext]:
    """Runs the enclosed block on `num_workers` managed local TFF C++ workers; always stops them.

    The context is installed on top of TFF's context stack for the calling thread and popped on
    exit, so code outside the block (and TFF pipelines that set their own default context) is
    untouched. With one worker it is TFF's synchronous context; with several a
    `MultiWorkerContext`, which splits each computation's clients across the workers.

    Args:
      log_dir: directory for the workers' logs (`tff_worker.log` for one worker,
        `tff_worker_<i>.log` for several); `None` discards their output.
      ready_timeout_s: how long to wait for each worker to answer (at start, and again after a
        failed call) before raising `WorkerError`.
      default_num_clients: CLIENTS cardinality used when a computation cannot infer it.
      num_workers: how many worker processes to start (>= 1).
      max_concurrent_calls: how many clients each worker trains at once (non-positive:
        unlimited, TFF's default); `None` means one per CPU core (`default_max_concurrent_calls`).

    Yields:
      The installed context.

    Raises:
      WorkerError: a worker did not start or become ready, or (inside the block) died.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1")

    def log_path(i):
        if not log_dir:
            return None
        name = "tff_worker.log" if num_workers == 1 else f"tff_worker_{i}.log"
        return pathlib.Path(log_dir) / name

    workers = [LocalWorker(log_path=log_path(i), index=i,
                           max_concurrent_computation_calls=max_concurrent_calls)
               for i in range(num_workers)]
    with _sigterm_raises():
        try:
            for worker in workers:  # all start together, then each must become ready
                worker.launch()
            for worker in workers:
                worker.wait_ready(ready_timeout_s)
            context = _create_context(workers, default_num_clients, ready_timeout_s)
            with _installed(context):
                yield context
        finally:
            for worker in workers:
                worker.stop()


@contextlib.contextmanager
def remote_runtime(
    addresses: Sequence[str],
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    default_num_clients: int = 0,
) -> Iterator[context_base.SyncContext]:
    """Runs the enclosed block on TFF workers started elsewhere, given as `host:port`.

    Start each worker first (`python -m scripts.start_worker --port=PORT` on its host, see
    docs/runtime.md). The workers are not stopped at exit (they serve further runs); only the
    connections are closed.

    Args:
      addresses: `host:port` of each worker (one: everything runs on it; several: each
        computation's clients are split across them, as in `local_runtime(num_workers=K)`).
      ready_timeout_s: how long to wait for each worker to answer (at start, and again after a
        failed call) before raising `WorkerError`.
      default_num_clients: CLIENTS cardinality used when a computation cannot infer it.

    Raises:
      WorkerError: an address is malformed, a worker is not ready in time, or (inside the block)
        a worker stopped answering.
    """
    if not addresses:
        raise ValueError("remote_runtime needs at least one worker address")
    workers = [RemoteWorker(address, index=i) for i, address in enumerate(addresses)]
    with _sigterm_raises():
        try:
            for worker in workers:
                worker.connect(ready_timeout_s)
            context = _create_context(workers, default_num_clients, ready_timeout_s)
            with _installed(context):
                yield context
        finally:
            for worker in workers:
                worker.stop()
