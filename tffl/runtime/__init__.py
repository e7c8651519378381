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
- for TFF's program layer (`tff.learning.programs.train_model`, `tff.program` state and release
  managers), `program_runtime()`: TFF's `tff.program.NativeFederatedContext` over either of the
  above (`program_context`), with `ClientDataSource` for seeded, resumable client data
  (tffl/runtime/program.py); a personalized process runs there under the program logic of
  tffl/runtime/personalized_program.py, which keeps every client's personal state.

Compilation: TFF's compiler for its worker, with its static Grappler pass over every graph (the
default, "tff") or without it ("none": each round kind is ready to train sooner), chosen by
`graph_optimization` (tffl/runtime/graph_optimization.py).

Faults: when a worker dies, or stops answering, the computation raises `WorkerError` naming the
worker (its number, pid or address and log file) instead of TFF's endless retries of a gRPC
`UNAVAILABLE`; a worker that is not ready within `ready_timeout_s` raises `WorkerError` too.
A local worker that crashes on its own (a segfault of the C++ worker, not a kill from outside) is
restarted and the computation run once more; a second crash raises `WorkerError`.
`tffl.simulation.driver.run_rounds` has checkpointed every completed round by then, so the run continues
with `resume=True` (`scripts/train.py --resume`). See docs/runtime.md.

Devices: the C++ worker pins every TensorFlow session it creates round-robin to the GPUs (or
TPUs) it sees (TFF's `SessionProvider`), with soft placement; there is no worker flag for it. The
`worker_binary` of the tensorflow-federated 0.87.0 wheel is built without CUDA, so it runs on CPU:
when TensorFlow sees a GPU, `local_runtime` and `remote_runtime` say so in one line on the `tffl`
logger (`gpu_note`), naming `--runtime=distribute` (`distribute_runtime`), which runs on it.

Example:

>>> from tffl import runtime
>>> from tffl.runtime import workers
>>> with runtime.local_runtime(num_workers=2):   # `process`: RoLoRA on two clients
...     state = process.next_round(process.initialize(), client_datasets).state  # a B round
>>> workers.running_workers()
[]
"""


from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Iterator, Sequence

import tensorflow_federated as tff

from tffl.runtime.tff_internals import context_base, context_stack_impl

from tffl.runtime.graph_optimization import DEFAULT_GRAPH_OPTIMIZATION, check_graph_optimization
from tffl.runtime.guarded import create_worker_context
from tffl.runtime.multi_worker import MultiWorkerContext
from tffl.runtime.program import program_context
from tffl.runtime.worker_connection import DEFAULT_READY_TIMEOUT_S, RemoteWorker
from tffl.runtime.workers import LocalWorker, sigterm_raises


def gpu_note(gpus: Sequence | None = None) -> str | None:
    """The line for a run on the TFF worker when TensorFlow sees GPUs (`gpus`, default
    `tf.config.list_physical_devices("GPU")`): the worker runs on CPU; None without GPUs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else list(gpus)
    if not gpus:
        return None
    return (f"TensorFlow sees {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}, but the TFF worker "
            "runs on CPU (TFF 0.87's worker_binary is built without CUDA); "
            "--runtime=distribute runs the clients' steps on the GPUs, in this process")


def _say_gpu_note() -> None:
    """Logs `gpu_note()` (if any) on the `tffl.runtime` logger, as a TFF worker runtime starts."""
    note = gpu_note()
    if note:
        logging.getLogger("tffl.runtime").warning(note)


def _create_context(workers, default_num_clients, ready_timeout_s,
                    graph_optimization) -> context_base.SyncContext:
    if len(workers) == 1:
        return create_worker_context(workers[0], default_num_clients, ready_timeout_s,
                                     graph_optimization)
    return MultiWorkerContext(workers, default_num_clients, ready_timeout_s, graph_optimization)


@contextlib.contextmanager
def installed(context: context_base.SyncContext) -> Iterator[context_base.SyncContext]:
    """Makes `context` (e.g. a `DistributeContext` kept across blocks, so that its compiled
    computations are reused) the current TFF context for the block."""
    with context_stack_impl.context_stack.install(context):
        yield context


_installed = installed


@contextlib.contextmanager
def local_runtime(
    log_dir: os.PathLike | str | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    default_num_clients: int = 0,
    num_workers: int = 1,
    max_concurrent_calls: int | None = None,
    graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
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
      graph_optimization: "tff" (TFF's compiler, with its Grappler pass over every graph) or
        "none" (without it: a round kind is ready sooner; `tffl.runtime.graph_optimization`).

    Yields:
      The installed context.

    Raises:
      WorkerError: a worker did not start or become ready, or (inside the block) died. A worker
        that crashes on its own (SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE) is first restarted and
        the computation run once more (`guarded.rerun_after_a_crash`).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1")
    check_graph_optimization(graph_optimization)

    def log_path(i):
        if not log_dir:
            return None
        name = "tff_worker.log" if num_workers == 1 else f"tff_worker_{i}.log"
        return pathlib.Path(log_dir) / name

    _say_gpu_note()
    workers = [LocalWorker(log_path=log_path(i), index=i,
                           max_concurrent_computation_calls=max_concurrent_calls)
               for i in range(num_workers)]
    with sigterm_raises():
        try:
            for worker in workers:  # all start together, then each must become ready
                worker.launch()
            for worker in workers:
                worker.wait_ready(ready_timeout_s)
            context = _create_context(workers, default_num_clients, ready_timeout_s,
                                      graph_optimization)
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
    graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
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
      graph_optimization: as for `local_runtime`.

    Raises:
      WorkerError: an address is malformed, a worker is not ready in time, or (inside the block)
        a worker stopped answering.
    """
    if not addresses:
        raise ValueError("remote_runtime needs at least one worker address")
    check_graph_optimization(graph_optimization)
    _say_gpu_note()
    workers = [RemoteWorker(address, index=i) for i, address in enumerate(addresses)]
    with sigterm_raises():
        try:
            for worker in workers:
                worker.connect(ready_timeout_s)
            context = _create_context(workers, default_num_clients, ready_timeout_s,
                                      graph_optimization)
            with _installed(context):
                yield context
        finally:
            for worker in workers:
                worker.stop()


@contextlib.contextmanager
def program_runtime(
    log_dir: os.PathLike | str | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    default_num_clients: int = 0,
    num_workers: int = 1,
    max_concurrent_calls: int | None = None,
    graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
) -> Iterator[tff.program.NativeFederatedContext]:
    """`local_runtime()` for TFF's program layer: installs a `tff.program.NativeFederatedContext`.

    TFF's program logic (`tff.learning.programs.train_model`, `tff.program` release and program
    state managers) is asynchronous and checks that the current context is a
    `tff.program.FederatedContext`; this block's context is one (`program_context`), running the
    computations on `num_workers` managed local workers started and stopped as by
    `local_runtime()` (same arguments). On exit, by an exception too, the previous context is
    back and no worker is left. Run the program's coroutine inside the block, in the block's
    thread (`asyncio.run(...)`); computations invoked there return value references to await.

    >>> with runtime.program_runtime(log_dir="runs/x"):  # doctest: +SKIP
    ...     asyncio.run(tff.learning.programs.train_model(
    ...         train_process=process, train_data_source=program.ClientDataSource("train", ds),
    ...         train_per_round_clients=2, train_total_rounds=4,
    ...         program_state_manager=tff.program.FileProgramStateManager("runs/x/state"),
    ...         model_output_manager=tff.program.MemoryReleaseManager(),
    ...         train_metrics_manager=tff.program.MemoryReleaseManager(),
    ...         evaluation_manager=None, evaluation_periodicity=1))
    >>> from tffl.runtime import workers
    >>> workers.running_workers()
    []
    """
    with local_runtime(log_dir, ready_timeout_s, default_num_clients, num_workers,
                       max_concurrent_calls, graph_optimization) as context:
        with _installed(program_context(context)) as federated_context:
            yield federated_context
