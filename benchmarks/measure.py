"""Measurement helpers: peak memory sampling, CPU seconds (and `Meter`, both over a span), TFF
compilation counts and cProfile summaries of a TFF call by stage."""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pathlib
import pstats
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import psutil
import tensorflow as tf

from tffl.runtime import tff_internals


class PeakSampler:
    """Samples the RSS of watched processes every `interval` seconds in a thread; `take()` returns
    the peaks since the previous `take()` (per process, and of their sum at one instant)."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self._procs: dict[str, psutil.Process] = {"python": psutil.Process()}
        self._lock = threading.Lock()
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def watch(self, name: str, pid: int | None) -> None:
        with self._lock:
            if pid is None:
                self._procs.pop(name, None)
            else:
                self._procs[name] = psutil.Process(pid)

    def _sample(self) -> None:
        with self._lock:
            procs = dict(self._procs)
        now = {}
        for name, proc in procs.items():
            with contextlib.suppress(psutil.Error):
                now[name] = proc.memory_info().rss
        now["total"] = sum(now.values())
        with self._lock:
            for name, rss in now.items():
                self._peak[name] = max(self._peak.get(name, 0), rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def take(self) -> dict[str, int]:
        self._sample()
        with self._lock:
            peak, self._peak = self._peak, {}
        return peak


def cpu_seconds(proc: psutil.Process | None) -> float:
    """User + system CPU seconds of `proc`. This process is read from `time.process_time()`
    (nanosecond clock): psutil's figures tick in 10 ms, so a short plain round could read 0."""
    if proc is None:
        return 0.0
    if proc.pid == os.getpid():
        return time.process_time()
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


class Meter:
    """Wall and CPU seconds (this process + the TFF worker) and peak RSS over a span
    (`--suite=targets`)."""

    def __init__(self, sampler: PeakSampler, worker: psutil.Process | None):
        self.sampler, self.worker, self.me = sampler, worker, psutil.Process()

    def cpu(self) -> float:
        return cpu_seconds(self.me) + cpu_seconds(self.worker)

    def measure(self, fn: Callable[[], object]) -> tuple[object, dict]:
        self.sampler.take()
        cpu, started = self.cpu(), time.perf_counter()
        out = fn()
        seconds, cpu_used = time.perf_counter() - started, self.cpu() - cpu
        peaks = self.sampler.take()
        return out, {"seconds": seconds, "cpu_seconds": cpu_used,
                     "peak_mb": peaks.get("total", 0) / 2**20,
                     "peak_mb_by_process": {k: v / 2**20 for k, v in peaks.items()
                                            if k != "total"}}


class CompileCounter:
    """Counts calls of TFF's native compiler in the contexts `tffl.runtime` creates with its
    default graph optimization (TFF caches the compiled form per context and computation, so a
    call is a compilation)."""

    def __init__(self):
        self.calls = 0
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self):
        native = tff_internals.native_compiler  # the TFF module the worker contexts call
        original = native.desugar_and_transform_to_native

        def counted(comp):
            self.calls += 1
            started = time.perf_counter()
            try:
                return original(comp)
            finally:
                self.seconds += time.perf_counter() - started

        native.desugar_and_transform_to_native = counted
        try:
            yield self
        finally:
            native.desugar_and_transform_to_native = original


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def profile_text(profiler: cProfile.Profile, top: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# (module file name, function) -> label: the stages of a TFF call, from TFF 0.87's sources.
_TFF_STAGES = {
    ("compiler_pipeline.py", "compile"): "compile (cached after round 1)",
    ("tensorflow_computation.py", "transform_args"): "transform_args (datasets -> graphs)",
    ("value_serialization.py", "serialize_value"): "serialize arguments",
    ("remote_executor.py", "create_value"): "create_value (send to worker)",
    ("remote_executor.py", "create_call"): "create_call",
    ("remote_executor.py", "_compute"): "compute (run on worker, fetch result)",
    ("value_serialization.py", "deserialize_value"): "deserialize results",
    ("tensorflow_computation.py", "transform_result"): "transform_result",
}


def profile_summary(profiler: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds of the stages of TFF calls (`_TFF_STAGES`) and the total."""
    stats = pstats.Stats(profiler)
    out: dict[str, float] = {}
    for (filename, _, func), (_, _, _, cumtime, _) in stats.stats.items():
        label = _TFF_STAGES.get((pathlib.Path(filename).name, func))
        if label is not None:
            out[label] = max(out.get(label, 0.0), cumtime)
    out["total"] = max((v[3] for v in stats.stats.values()), default=0.0)
    return {k: round(v, 4) for k, v in out.items()}


def profile_tff_call(context, fn: Callable[[], object]) -> cProfile.Profile:
    """cProfile of `fn()` where TFF does its work: `SyncExecutionContext.invoke` runs the call as
    a coroutine on its own event-loop thread (serialization, gRPC to the worker), so the profiler
    is switched on and off in that thread (falls back to this thread)."""
    import asyncio

    profiler = cProfile.Profile()
    loop = getattr(getattr(context, "_async_runner", None), "_event_loop", None)
    if loop is None:
        profiler.runcall(fn)
        return profiler

    async def switch(on: bool):
        profiler.enable() if on else profiler.disable()

    asyncio.run_coroutine_threadsafe(switch(True), loop).result()
    try:
        fn()
    finally:
        asyncio.run_coroutine_threadsafe(switch(False), loop).result()
    return profiler


def state_round_trip_seconds(weights_type, weights, repeats: int = 2) -> float:
    """Seconds to send the model weights from Python to the TFF worker and back: an identity TF
    computation on them (its first call, which compiles, is not timed). Every `next` pays this
    once (the state goes in, the new state comes out), whatever the clients do."""
    import tensorflow_federated as tff

    @tff.tensorflow.computation(weights_type)
    def identity(w):
        return tf.nest.map_structure(tf.identity, w)

    identity(weights)
    started = time.perf_counter()
    for _ in range(repeats):
        identity(weights)
    return (time.perf_counter() - started) / repeats
