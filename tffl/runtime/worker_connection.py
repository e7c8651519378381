"""The gRPC side of a TFF worker: its channel, readiness and loss checks, and remote workers.

`Worker` is what the contexts need from any worker (a channel with TFF's executor stub, a wait
until it answers, and the check after a failed RPC whether the worker is gone); `RemoteWorker` is
one started elsewhere that this process only connects to. Starting and stopping local worker
processes is `tffl.runtime.workers`' job.
"""

from __future__ import annotations

import time

import grpc

from tffl.runtime.tff_internals import remote_executor_grpc_stub

DEFAULT_READY_TIMEOUT_S = 60.0
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]


class WorkerError(RuntimeError):
    """A TFF worker could not be started, did not become ready, or died / stopped answering."""


class Worker:
    """What the contexts need from a worker: a gRPC channel, readiness and fault checks."""

    address: str
    # How many times the worker was restarted (`LocalWorker.restart`): executors made for an
    # earlier generation are gone with its process.
    generation: int = 0
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

    def _ready_or_stop(self, timeout_s: float) -> None:
        """`wait_ready(timeout_s)`; if the worker does not answer (or the wait is interrupted,
        e.g. by a SIGTERM), stops it (`stop`) and re-raises. What `RemoteWorker.connect` and
        `LocalWorker.start` do after opening or launching."""
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

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


class RemoteWorker(Worker):
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
        self._ready_or_stop(ready_timeout_s)
        return self

    def stop(self) -> None:
        """Closes the connection (the remote worker keeps running)."""
        self._close_channel()
