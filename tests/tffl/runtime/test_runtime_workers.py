"""tffl.runtime: managed TFF workers start, run computations (one, or several splitting the
clients, or workers started elsewhere) and stop. Workers and owners that die: test_runtime.py."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import portpicker
import psutil
import pytest
import tensorflow_federated as tff

from tffl import runtime
from tffl.runtime import multi_worker
from tffl.runtime import worker_connection
from tffl.runtime import workers as workers_lib
from tests.tffl.runtime.runtime_helpers import gone, federated_mean

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_runs_a_computation_and_stops_the_worker(tmp_path):
    with runtime.local_runtime(log_dir=tmp_path):
        assert federated_mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
        pids = workers_lib.running_workers()
        assert len(pids) == 1
    assert gone(pids[0])
    assert workers_lib.running_workers() == []
    assert (tmp_path / "tff_worker.log").exists()


def test_worker_stopped_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with runtime.local_runtime():
            pids = workers_lib.running_workers()
            raise RuntimeError("boom")
    assert pids and all(gone(p) for p in pids)


def test_readiness_timeout_is_a_clear_error(monkeypatch, tmp_path):
    # A "worker" that never answers: the readiness loop must give up with WorkerError.
    silent = tmp_path / "silent_worker"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    monkeypatch.setattr(runtime.workers, "worker_binary_path", lambda: silent)
    worker = workers_lib.LocalWorker()
    with pytest.raises(worker_connection.WorkerError, match="not ready after 1 s"):
        worker.start(ready_timeout_s=1.0)
    assert worker.process is None


# --- Several workers ---------------------------------------------------------------------------


@tff.tensorflow.computation(np.float32, np.float32)
def _squared_deviation(value, mean):
    return (value - mean) ** 2


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _variance(values):
    """Two dependent aggregations: the mean, then the mean squared deviation from it."""
    mean = tff.federated_mean(values)
    deviations = tff.federated_map(_squared_deviation,
                                   (values, tff.federated_broadcast(mean)))
    return tff.federated_mean(deviations)


def test_two_workers_run_a_computation_and_are_stopped(tmp_path):
    assert len(multi_worker.compile_to_mergeable_stages(federated_mean)) == 1
    assert len(multi_worker.compile_to_mergeable_stages(_variance)) == 2
    values = [1.0, 2.0, 6.0, 3.0, 8.0]
    with runtime.local_runtime(log_dir=tmp_path, num_workers=2) as context:
        assert isinstance(context, multi_worker.MultiWorkerContext)
        assert federated_mean(values) == pytest.approx(4.0)
        assert _variance(values) == pytest.approx(np.var(values))
        assert context.unsplit == {}
        pids = workers_lib.running_workers()
        assert sorted(pids) == sorted(w.pid for w in context.workers) and len(pids) == 2
    assert all(gone(p) for p in pids)
    assert workers_lib.running_workers() == []
    assert (tmp_path / "tff_worker_0.log").exists() and (tmp_path / "tff_worker_1.log").exists()


def test_split_clients_cuts_every_clients_value_alike():
    """Contiguous groups of ceil(remaining / parts left) clients, server values repeated, also
    when the last element of the argument is SERVER-placed (TFF 0.87's own splitter repeats the
    first group there)."""
    type_spec = tff.StructType([
        tff.StructType([tff.FederatedType(np.float32, tff.SERVER),
                        tff.FederatedType(np.float32, tff.CLIENTS)]),
        tff.FederatedType(np.int32, tff.SERVER),
    ])
    parts = multi_worker.split_clients([[9.0, [1.0, 2.0, 3.0, 4.0, 5.0]], 7], type_spec, 2)
    assert [[p[0][0], list(p[0][1]), p[1]] for p in parts] == [
        [9.0, [1.0, 2.0, 3.0], 7], [9.0, [4.0, 5.0], 7]]
    assert len(multi_worker.split_clients([[9.0, [1.0]], 7], type_spec, 3)) == 1


def test_computation_tff_cannot_split_runs_whole_on_worker_0(monkeypatch):
    def cannot(comp):
        raise ValueError("Detected one aggregate dependent on another. (simulated)")

    monkeypatch.setattr(runtime.multi_worker, "compile_to_mergeable_stages", cannot)
    with runtime.local_runtime(num_workers=2) as context:
        assert federated_mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
        assert list(context.unsplit.values()) == [
            "ValueError: Detected one aggregate dependent on another. (simulated)"]


# --- Workers started elsewhere, and workers that never answer ----------------------------------


def test_remote_worker_that_stops_answering_is_named(tmp_path):
    """Workers given by address (started elsewhere; here two local ones): one that goes away
    raises WorkerError naming its address after `ready_timeout_s`, not an endless retry."""
    hosts = [workers_lib.LocalWorker(index=i).start() for i in range(2)]
    try:
        addresses = [w.address for w in hosts]
        with runtime.remote_runtime(addresses, ready_timeout_s=2.0):
            assert federated_mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
            hosts[1].stop()
            started = time.monotonic()
            with pytest.raises(worker_connection.WorkerError,
                               match=f"TFF worker #1 at {addresses[1]} "
                               "(stopped answering|was not ready after 2 s)"):
                federated_mean([1.0, 2.0, 6.0])
            assert time.monotonic() - started < 30
        assert hosts[0].is_alive()  # remote workers are not ours to stop
    finally:
        for w in hosts:
            w.stop()
    assert workers_lib.running_workers() == []


def test_unreachable_address_is_a_clear_error_within_the_timeout():
    started = time.monotonic()
    address = f"localhost:{portpicker.pick_unused_port()}"
    with pytest.raises(worker_connection.WorkerError,
                       match=f"TFF worker #0 at {address} was not ready after 1 s; is a worker "
                             "running there"):
        with runtime.remote_runtime([address], ready_timeout_s=1.0):
            pass
    assert time.monotonic() - started < 10
    with pytest.raises(worker_connection.WorkerError, match="'nohost' must be host:port"):
        with runtime.remote_runtime(["nohost"]):
            pass


def test_workers_that_never_answer_time_out_and_are_stopped(monkeypatch, tmp_path):
    silent = tmp_path / "silent_worker"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    monkeypatch.setattr(runtime.workers, "worker_binary_path", lambda: silent)
    started = []
    launch = workers_lib.LocalWorker.launch

    def recording_launch(self):
        started.append(launch(self).pid)
        return self

    monkeypatch.setattr(workers_lib.LocalWorker, "launch", recording_launch)
    with pytest.raises(worker_connection.WorkerError,
                       match=r"TFF worker #0 \(pid \d+.*not ready after 1 s"):
        with runtime.local_runtime(num_workers=2, ready_timeout_s=1.0):
            pass
    assert len(started) == 2 and all(gone(pid) for pid in started)


def _concurrency_flag(pid: int) -> str:
    (flag,) = [a for a in psutil.Process(pid).cmdline()
               if a.startswith("--max_concurrent_computation_calls=")]
    return flag.split("=", 1)[1]


def test_workers_run_one_client_per_core_by_default_and_take_a_given_limit():
    with runtime.local_runtime():
        (pid,) = workers_lib.running_workers()
        assert _concurrency_flag(pid) == str(os.cpu_count())
        assert federated_mean([1.0, 3.0]) == pytest.approx(2.0)
    with runtime.local_runtime(max_concurrent_calls=-1, num_workers=2):
        assert [_concurrency_flag(p) for p in workers_lib.running_workers()] == ["-1", "-1"]
    assert workers_lib.running_workers() == []


_TFF_ONLY_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tensorflow_federated as tff
    import tffl.production  # imports TFF, not tffl.runtime

    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def total(x):
        return tff.federated_sum(x)

    print("SUM", total([1, 2]))          # on TFF's own default context: it starts a worker
    print("RUNTIME", "tffl.runtime" in sys.modules)
    workers = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if ppid == os.getpid() and b"worker_binary" in command:
            workers.append(int(entry))
    print("WORKERS", *workers, flush=True)
    """
)


def test_tffs_default_context_worker_is_stopped_when_only_tff_was_imported(tmp_path):
    """A process that imports a tffl module that imports TFF but not `tffl.runtime` (here
    `tffl.production`) and runs a computation on TFF's own default context: at exit `tffl`'s hook
    stops the worker TFF started (without it, it outlives Python and holds the pipes) and
    Python's teardown prints no traceback from TFF's context."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:   # files: a pipe would hang on
        subprocess.run([sys.executable, "-c", _TFF_ONLY_CHILD], stdout=stdout, stderr=stderr,
                       cwd=REPO_ROOT, timeout=600, check=False)   # a worker that outlives it
    lines = dict(line.split(" ", 1) for line in out.read_text().splitlines() if " " in line)
    workers = [int(pid) for pid in lines.get("WORKERS", "").split()]
    stray = [pid for pid in workers if not gone(pid)]
    for pid in stray:
        os.kill(pid, 9)
    assert (lines.get("SUM"), lines.get("RUNTIME")) == ("3", "False"), err.read_text()[-2000:]
    assert len(workers) == 1 and not stray, (workers, stray)
    assert "Exception ignored" not in err.read_text(), err.read_text()[-2000:]
