"""TFF's execution contexts over one worker, with the gRPC errors of a lost worker turned into `WorkerError`."""


from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from tensorflow_federated.proto.v0 import executor_pb2

from tffl.runtime.tff_internals import (
    async_execution_context,
    placements,
    python_executor_stacks,
    remote_executor,
    remote_executor_stub,
    sync_execution_context,
    tensorflow_computation,
    value_serialization,
)

from tffl.runtime.graph_optimization import DEFAULT_GRAPH_OPTIMIZATION, compiler
from tffl.runtime.worker_connection import DEFAULT_READY_TIMEOUT_S, Worker, WorkerError
from tffl.runtime.workers import LocalWorker

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _GuardedStub(remote_executor_stub.RemoteExecutorStub):
    """TFF's gRPC stub for one worker, turning the RPC errors of a lost worker into `WorkerError`.

    Without this, TFF retries a gRPC `UNAVAILABLE` forever (it is a `RetryableError`), so a dead
    worker hangs the run. `WorkerError` is not retryable: it ends the computation.
    """

    def __init__(self, worker: Worker, timeout_s: float):
        if worker.stub is None:
            raise WorkerError(f"{worker.describe()} is not running (it was stopped)")
        self._worker = worker
        self._timeout_s = timeout_s
        self._stub = worker.stub
        self._generation = worker.generation

    def _replaced(self) -> bool:
        """Whether the worker process this stub talked to was replaced by a restart."""
        return self._generation != self._worker.generation

    def _call(self, name: str, request):
        if self._replaced():
            raise WorkerError(f"{self._worker.describe()} was restarted; this executor is gone")
        try:
            return getattr(self._stub, name)(request)
        except grpc.RpcError as e:
            self._worker.raise_if_lost(e, self._timeout_s)
            raise

    def _dispose_call(self, name: str, request, empty):
        # Called from finalizers too: after the worker is gone there is nothing left to free.
        if self._replaced():
            return empty
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


class _WorkerExecutorFactory(python_executor_stacks.ResourceManagingExecutorFactory):
    """TFF's cache of one executor per cardinalities, emptied when the worker is restarted (its
    executors lived in the process that ended)."""

    def __init__(self, worker: Worker, stack_fn):
        super().__init__(stack_fn)
        self._worker = worker
        self._generation = worker.generation

    def create_executor(self, cardinalities):
        if self._generation != self._worker.generation:
            for executor in list(self._executors.values()):
                executor.close()
            self._executors.clear()
            self._generation = self._worker.generation
        return super().create_executor(cardinalities)


def rerun_after_a_crash(
    workers: Sequence[Worker], ready_timeout_s: float, call: Callable[[], _T]
) -> _T:
    """`call()`; if it fails because a local worker crashed (`LocalWorker.crashed`: SIGSEGV,
    SIGBUS, SIGABRT, SIGILL, SIGFPE), restarts the crashed workers and calls once more.

    A computation is a function of its argument, so its second run gives what the first would
    have. A worker killed from outside (SIGKILL, SIGTERM, SIGINT) or that crashes again ends the
    call with `WorkerError`, as does a remote worker that stops answering."""
    try:
        return call()
    except WorkerError as error:
        crashed = [w for w in workers if isinstance(w, LocalWorker) and w.crashed()]
        if not crashed:
            raise
        first_error = error
    for worker in crashed:
        old = worker.describe()
        worker.restart(ready_timeout_s)
        _log.warning("tffl.runtime: %s crashed; restarted as %s, running the computation again",
                     old, worker.describe())
    try:
        return call()
    except WorkerError as error:
        raise WorkerError(f"{error} (on the second run, after a restart that followed: "
                          f"{first_error})") from error


class _RestartingSyncContext(sync_execution_context.SyncExecutionContext):
    """TFF's synchronous context on one worker, restarting it once if it crashes in a call."""

    def __init__(self, worker: Worker, ready_timeout_s: float, **kwargs):
        super().__init__(**kwargs)
        self.workers = [worker]
        self._ready_timeout_s = ready_timeout_s

    def invoke(self, comp, arg):
        return rerun_after_a_crash(self.workers, self._ready_timeout_s,
                                   lambda: super(_RestartingSyncContext, self).invoke(comp, arg))


def _executor_factory(
    worker: Worker, default_num_clients: int, timeout_s: float, threaded: bool = False
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

    return _WorkerExecutorFactory(worker, stack_fn)


def create_worker_context(
    worker: Worker,
    default_num_clients: int = 0,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
) -> sync_execution_context.SyncExecutionContext:
    """TFF's synchronous execution context executing on an already started `worker` (restarted
    once if it crashes during a call: `rerun_after_a_crash`), compiling with
    `graph_optimization.compiler(graph_optimization)`."""
    return _RestartingSyncContext(
        worker,
        ready_timeout_s,
        executor_fn=_executor_factory(worker, default_num_clients, ready_timeout_s),
        compiler_fn=compiler(graph_optimization),
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


def create_async_worker_context(
    worker: Worker, default_num_clients: int, ready_timeout_s: float,
    graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
) -> async_execution_context.AsyncExecutionContext:
    """TFF's asynchronous execution context on one worker (what the mergeable context drives)."""
    return async_execution_context.AsyncExecutionContext(
        executor_fn=_executor_factory(worker, default_num_clients, ready_timeout_s, threaded=True),
        compiler_fn=compiler(graph_optimization),
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result,
    )


