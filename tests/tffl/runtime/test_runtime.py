"""tffl.runtime: managed TFF workers run computations (one, or several splitting the clients),
name a worker that dies, and never outlive their owner."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import portpicker
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.simulation import checkpoint
from tffl.algorithms import lora_fl
from tffl.simulation import participation
from tffl.engine import roles
from tffl import runtime
from tffl.simulation import driver as simulation


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _mean(values):
    return tff.federated_mean(values)


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_runs_a_computation_and_stops_the_worker(tmp_path):
    with runtime.local_runtime(log_dir=tmp_path):
        assert _mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
        pids = runtime.running_workers()
        assert len(pids) == 1
    assert _gone(pids[0])
    assert runtime.running_workers() == []
    assert (tmp_path / "tff_worker.log").exists()


def test_worker_stopped_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with runtime.local_runtime():
            pids = runtime.running_workers()
            raise RuntimeError("boom")
    assert pids and all(_gone(p) for p in pids)


def test_readiness_timeout_is_a_clear_error(monkeypatch, tmp_path):
    # A "worker" that never answers: the readiness loop must give up with WorkerError.
    silent = tmp_path / "silent_worker"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    monkeypatch.setattr(runtime.workers, "worker_binary_path", lambda: silent)
    worker = runtime.LocalWorker()
    with pytest.raises(runtime.WorkerError, match="not ready after 1 s"):
        worker.start(ready_timeout_s=1.0)
    assert worker.process is None


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import tensorflow_federated as tff
    from tffl import runtime

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(values):
        return tff.federated_mean(values)

    with runtime.local_runtime(num_workers=int(sys.argv[1])):
        mean([1.0, 2.0, 3.0])
        print("READY", *runtime.running_workers(), flush=True)
        time.sleep(120)
    """
)


# The fast tier kills the owner one way; the large tier every way (tests in tiers: README).
@pytest.mark.parametrize("sig, workers", [
    (signal.SIGINT, 1), pytest.param(signal.SIGTERM, 1, marks=pytest.mark.large),
    pytest.param(signal.SIGKILL, 1, marks=pytest.mark.large), pytest.param(signal.SIGKILL, 2, marks=pytest.mark.large),
])
def test_no_worker_outlives_a_killed_owner(sig, workers):
    """SIGINT/SIGTERM run the teardown; SIGKILL is covered by PR_SET_PDEATHSIG."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(workers)], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=env,
        # A shell without job control starts background jobs with SIGINT ignored; the owner
        # must see SIGINT as a user's Ctrl-C does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"child did not start: {line!r}"
        worker_pids = [int(pid) for pid in line.split()[1:]]
        assert len(worker_pids) == workers
        assert not any(_gone(pid, timeout_s=0.2) for pid in worker_pids)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        for pid in worker_pids:
            assert _gone(pid), f"worker {pid} outlived its owner after {sig.name}"
        # The workers held no copy of our pipe: reading to EOF returns instead of hanging.
        assert proc.stdout.read() is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM


_BLOCKED_CHILD = textwrap.dedent(
    """
    import threading, time
    from tffl.runtime import workers

    workers.SIGTERM_EXIT_DEADLINE_S = 1.0
    with workers._sigterm_raises():
        # A library's non-daemon thread that never ends: Python's shutdown would join it forever.
        threading.Thread(target=threading.Event().wait).start()
        print("READY", flush=True)
        time.sleep(120)
    """
)


def _sigtermed(child: str, *second_after: str) -> tuple[int, str, str]:
    """Runs `child`; once it prints READY, SIGTERMs it, and, if `second_after` names the line it
    prints next, SIGTERMs it again after that line. Returns (status, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        assert proc.stdout.readline().startswith("READY")
        proc.send_signal(signal.SIGTERM)
        for line in second_after:
            assert proc.stdout.readline().startswith(line)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.large
def test_a_sigtermed_run_exits_although_a_thread_never_ends():
    status, _, err = _sigtermed(_BLOCKED_CHILD)
    assert status == 128 + signal.SIGTERM
    assert "still alive 1 s after SIGTERM" in err


_TWICE_TERMINATED_CHILD = textwrap.dedent(
    """
    import time
    from tffl.runtime import workers

    with workers._sigterm_raises():
        try:
            print("READY", flush=True)
            time.sleep(120)
        finally:
            print("STOPPING", flush=True)
            time.sleep(1.5)  # the cleanup (closing channels, stopping workers) takes a while
            print("CLEANED", flush=True)
    """
)


@pytest.mark.large
def test_a_second_sigterm_does_not_interrupt_the_cleanup():
    # A process manager and the parent-death signal can both send SIGTERM; the second one used
    # to raise inside the cleanup (inside gRPC's Channel.close, leaving a channel half-closed).
    status, out, err = _sigtermed(_TWICE_TERMINATED_CHILD, "STOPPING")
    assert "CLEANED" in out, err
    assert status == 128 + signal.SIGTERM
    assert "signal 15 again; already stopping" in err


_SWALLOWING_CHILD = textwrap.dedent(
    """
    import time
    from tffl.runtime import workers

    workers.SIGTERM_EXIT_DEADLINE_S = 1.0
    with workers._sigterm_raises():
        ready = False
        while True:
            try:
                if not ready:  # inside the try: a SIGTERM right after READY is swallowed too
                    ready = True
                    print("READY", flush=True)
                time.sleep(120)
            except BaseException:  # as a finalizer or a callback would swallow it
                print("SWALLOWED", flush=True)
    """
)


def test_a_second_sigterm_ends_a_run_that_swallowed_the_first():
    status, _, err = _sigtermed(_SWALLOWING_CHILD, "SWALLOWED")
    assert status == 128 + signal.SIGTERM
    assert "already stopping (exiting within 1 s)" in err
    assert "still alive 1 s after SIGTERM" in err


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
    assert len(runtime.compile_to_mergeable_stages(_mean)) == 1
    assert len(runtime.compile_to_mergeable_stages(_variance)) == 2
    values = [1.0, 2.0, 6.0, 3.0, 8.0]
    with runtime.local_runtime(log_dir=tmp_path, num_workers=2) as context:
        assert isinstance(context, runtime.MultiWorkerContext)
        assert _mean(values) == pytest.approx(4.0)
        assert _variance(values) == pytest.approx(np.var(values))
        assert context.unsplit == {}
        pids = runtime.running_workers()
        assert sorted(pids) == sorted(w.pid for w in context.workers) and len(pids) == 2
    assert all(_gone(p) for p in pids)
    assert runtime.running_workers() == []
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
    parts = runtime.split_clients([[9.0, [1.0, 2.0, 3.0, 4.0, 5.0]], 7], type_spec, 2)
    assert [[p[0][0], list(p[0][1]), p[1]] for p in parts] == [
        [9.0, [1.0, 2.0, 3.0], 7], [9.0, [4.0, 5.0], 7]]
    assert len(runtime.split_clients([[9.0, [1.0]], 7], type_spec, 3)) == 1


def test_computation_tff_cannot_split_runs_whole_on_worker_0(monkeypatch):
    def cannot(comp):
        raise ValueError("Detected one aggregate dependent on another. (simulated)")

    monkeypatch.setattr(runtime.multi_worker, "compile_to_mergeable_stages", cannot)
    with runtime.local_runtime(num_workers=2) as context:
        assert _mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
        assert list(context.unsplit.values()) == [
            "ValueError: Detected one aggregate dependent on another. (simulated)"]


# A small federated LoRA problem (as in test_lora_fl): y = x·W0 + x·A·B, five clients of unequal
# size, four sampled per round, MSE loss.
_RNG = np.random.default_rng(3)
_D_IN, _D_OUT, _R = 4, 3, 2
_W0 = _RNG.normal(size=(_D_IN, _D_OUT)).astype(np.float32)
_A0 = _RNG.normal(size=(_D_IN, _R)).astype(np.float32)
_CLIENT_DATA = {
    f"c{i}": (_RNG.normal(size=(n, _D_IN)).astype(np.float32),
              _RNG.normal(size=(n, _D_OUT)).astype(np.float32))
    for i, n in enumerate((4, 6, 2, 4, 3))
}


class _LinearLora(tf.keras.layers.Layer):
    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=_W0.shape, trainable=False,
                                      initializer=tf.constant_initializer(_W0))
        self.lora_a = self.add_weight(name="lora_a", shape=_A0.shape,
                                      initializer=tf.constant_initializer(_A0))
        self.lora_b = self.add_weight(name="lora_b", shape=(_R, _D_OUT), initializer="zeros")
        roles.tag(self.kernel, roles.FROZEN)
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)

    def call(self, x):
        return tf.matmul(x, self.kernel) + tf.matmul(tf.matmul(x, self.lora_a), self.lora_b)


def _model_fn():
    x = tf.keras.Input((_D_IN,))
    return tf.keras.Model(x, _LinearLora()(x))


def _process(name):
    spec = (tf.TensorSpec([None, _D_IN], tf.float32), tf.TensorSpec([None, _D_OUT], tf.float32))
    return lora_fl.build_lora_process(name, _model_fn, spec, 0.1,
                                      loss_fn=tf.keras.losses.MeanSquaredError)


def _client_dataset(client_id, round_num):
    return tf.data.Dataset.from_tensor_slices(_CLIENT_DATA[client_id]).batch(2)


_ROUNDS = 3


def _run(process, output_dir, resume=False):
    return simulation.run_rounds(
        process, participation.UniformSampler(sorted(_CLIENT_DATA), 4, seed=1), _client_dataset,
        rounds=_ROUNDS, output_dir=output_dir, resume=resume, log=None,
    )


def _rows(output_dir):
    drop = set(simulation.TIMING_COLUMNS)
    return [{k: v for k, v in row.items() if k not in drop}
            for row in simulation.read_metrics(output_dir / simulation.METRICS_FILE)]


def _assert_same_run(a, b, rtol=1e-5, atol=1e-6):
    """Same final state and metrics rows, up to float rounding."""
    for x, y in zip(tf.nest.flatten(a.state), tf.nest.flatten(b.state), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
    assert [r["round"] for r in a.history] == [r["round"] for r in b.history]
    for row_a, row_b in zip(a.history, b.history):
        assert set(row_a) == set(row_b)
        for key in set(row_a) - set(simulation.TIMING_COLUMNS):
            assert row_a[key] == pytest.approx(row_b[key], rel=rtol, abs=atol), key


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """`{(algorithm, workers): SimulationResult}`, each run once for the module."""
    runs = {}

    def get(algorithm, workers):
        if (algorithm, workers) not in runs:
            out = tmp_path_factory.mktemp(f"{algorithm}_{workers}w")
            with runtime.local_runtime(num_workers=workers) as context:
                runs[algorithm, workers] = _run(_process(algorithm), out)
                if workers > 1:
                    assert context.unsplit == {}  # every computation was split across workers
            assert runtime.running_workers() == []
        return runs[algorithm, workers]

    return get


@pytest.mark.parametrize("algorithm", [pytest.param("fedavg_lora", marks=pytest.mark.large), "rolora"])
def test_two_workers_give_the_same_run_as_one(reference_runs, algorithm):
    """FedAvg-LoRA's `next` has one layer of aggregations (one mergeable stage); RoLoRA's has two
    (its A round is broadcast from the B round's aggregate), so it runs as two stages."""
    _assert_same_run(reference_runs(algorithm, 1), reference_runs(algorithm, 2))


def _kills_a_worker(process, pid, at):
    """`process` (a `Process`, which `run_rounds` recognises) whose `next_round` SIGKILLs
    process `pid` as round `at` starts (an instance attribute shadowing the method)."""
    calls, next_round = [0], process.next_round

    def killing_next_round(state, data):  # what run_rounds calls: one communication round
        calls[0] += 1
        if calls[0] == at:
            os.kill(pid, signal.SIGKILL)
            assert _gone(pid)  # dead (a zombie until the runtime reaps it)
        return next_round(state, data)

    process.next_round = killing_next_round
    return process


def test_killed_worker_stops_the_run_and_resume_matches(reference_runs, tmp_path):
    process = _process("rolora")
    with runtime.local_runtime(log_dir=tmp_path / "logs", num_workers=2) as context:
        victim = context.workers[1]
        with pytest.raises(runtime.WorkerError) as error:
            _run(_kills_a_worker(process, victim.pid, at=3), tmp_path / "run")
    message = str(error.value)
    assert f"TFF worker #1 (pid {victim.pid}, {victim.address}" in message
    assert "killed by SIGKILL" in message and str(tmp_path / "logs" / "tff_worker_1.log") in message
    assert runtime.running_workers() == []
    assert checkpoint.latest(tmp_path / "run" / simulation.CHECKPOINT_DIR)[0] == 2

    del process.next_round   # the method again
    with runtime.local_runtime(num_workers=2):
        resumed = _run(process, tmp_path / "run", resume=True)
    assert resumed.first_round == 3
    _assert_same_run(resumed, reference_runs("rolora", 2), rtol=1e-6, atol=1e-7)
    assert _rows(tmp_path / "run") == [
        {k: v for k, v in r.items() if k not in simulation.TIMING_COLUMNS}
        for r in reference_runs("rolora", 2).history]


@tff.tensorflow.computation(np.int32)
def _spin(n):
    """About n·1 µs of CPU: a loop of n scalar steps."""
    def body(i, acc):
        return i + 1, acc + tf.sin(tf.cast(i, tf.float32))
    return tf.while_loop(lambda i, acc: i < n, body, (tf.constant(0), tf.constant(0.0)))[1]


@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def _slow_sum(steps):
    return tff.federated_sum(tff.federated_map(_spin, steps))


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.large)])
def test_worker_killed_mid_computation_is_named_at_once(tmp_path, workers):
    with runtime.local_runtime(log_dir=tmp_path, num_workers=workers) as context:
        assert _slow_sum([10, 10, 10, 10]) == pytest.approx(4 * np.sin(np.arange(10)).sum(),
                                                            rel=1e-5)
        victim = psutil.Process(runtime.running_workers()[-1] if workers == 1
                                else context.workers[1].pid)
        busy = sum(victim.cpu_times()[:2]) + 0.3
        killed_at = []

        def kill_when_busy():  # once the worker has computed for 0.3 s of CPU time
            while sum(victim.cpu_times()[:2]) < busy:
                time.sleep(0.02)
            victim.kill()
            killed_at.append(time.monotonic())

        threading.Thread(target=kill_when_busy, daemon=True).start()
        with pytest.raises(runtime.WorkerError, match=rf"TFF worker #{workers - 1} \(pid "
                           rf"{victim.pid}.*killed by SIGKILL while running a computation"):
            _slow_sum([3_000_000] * 4)  # seconds of CPU per client
        assert killed_at and time.monotonic() - killed_at[0] < 15
    assert runtime.running_workers() == []


def _crash_when_busy(context, times: int) -> list[int]:
    """Starts a thread that, `times` times, waits until the runtime's last worker (a new process
    each time) has computed for 0.3 s of CPU and sends it SIGSEGV; returns the pids signalled."""
    signalled = []

    def crash():
        for _ in range(times):
            while context.workers[-1].pid in signalled or not context.workers[-1].is_alive():
                time.sleep(0.02)
            victim = psutil.Process(context.workers[-1].pid)
            busy = sum(victim.cpu_times()[:2]) + 0.3
            while sum(victim.cpu_times()[:2]) < busy:
                time.sleep(0.02)
            victim.send_signal(signal.SIGSEGV)
            signalled.append(victim.pid)

    threading.Thread(target=crash, daemon=True).start()
    return signalled


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.large)])
def test_crashed_worker_is_restarted_and_the_computation_run_again(tmp_path, workers, caplog):
    """A worker that crashes (SIGSEGV) mid-computation is replaced and the computation run again:
    its result is the undisturbed one. External kills still end the run (tests above)."""
    steps = [400_000] * 4  # about 0.8 s of CPU per client here
    with runtime.local_runtime(log_dir=tmp_path, num_workers=workers) as context:
        signalled = _crash_when_busy(context, times=1)
        with caplog.at_level("WARNING", logger="tffl.runtime"):
            crashed_run = _slow_sum(steps)
        assert len(signalled) == 1 and signalled[0] not in runtime.running_workers()
        assert len(runtime.running_workers()) == workers
        assert context.workers[-1].generation == 1 and context.workers[0].generation == (
            0 if workers == 2 else 1)
        assert f"pid {signalled[0]}" in caplog.text and "crashed; restarted as" in caplog.text
        assert crashed_run == _slow_sum(steps)  # an undisturbed run, on the restarted worker
    assert runtime.running_workers() == []


def test_worker_that_crashes_again_after_its_restart_ends_the_run(tmp_path):
    with runtime.local_runtime(log_dir=tmp_path) as context:
        signalled = _crash_when_busy(context, times=2)
        with pytest.raises(runtime.WorkerError, match=r"killed by SIGSEGV while running a "
                           r"computation \(on the second run, after a restart that followed: "
                           r"TFF worker #0 \(pid \d+.*killed by SIGSEGV"):
            _slow_sum([3_000_000] * 4)
        assert len(signalled) == 2
    assert runtime.running_workers() == []


def test_remote_worker_that_stops_answering_is_named(tmp_path):
    """Workers given by address (started elsewhere; here two local ones): one that goes away
    raises WorkerError naming its address after `ready_timeout_s`, not an endless retry."""
    hosts = [runtime.LocalWorker(index=i).start() for i in range(2)]
    try:
        addresses = [w.address for w in hosts]
        with runtime.remote_runtime(addresses, ready_timeout_s=2.0):
            assert _mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
            hosts[1].stop()
            started = time.monotonic()
            with pytest.raises(runtime.WorkerError, match=f"TFF worker #1 at {addresses[1]} "
                               "(stopped answering|was not ready after 2 s)"):
                _mean([1.0, 2.0, 6.0])
            assert time.monotonic() - started < 30
        assert hosts[0].is_alive()  # remote workers are not ours to stop
    finally:
        for w in hosts:
            w.stop()
    assert runtime.running_workers() == []


def test_unreachable_address_is_a_clear_error_within_the_timeout():
    started = time.monotonic()
    address = f"localhost:{portpicker.pick_unused_port()}"
    with pytest.raises(runtime.WorkerError,
                       match=f"TFF worker #0 at {address} was not ready after 1 s; is a worker "
                             "running there"):
        with runtime.remote_runtime([address], ready_timeout_s=1.0):
            pass
    assert time.monotonic() - started < 10
    with pytest.raises(runtime.WorkerError, match="'nohost' must be host:port"):
        with runtime.remote_runtime(["nohost"]):
            pass


def test_workers_that_never_answer_time_out_and_are_stopped(monkeypatch, tmp_path):
    silent = tmp_path / "silent_worker"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    monkeypatch.setattr(runtime.workers, "worker_binary_path", lambda: silent)
    started = []
    launch = runtime.LocalWorker.launch

    def recording_launch(self):
        started.append(launch(self).pid)
        return self

    monkeypatch.setattr(runtime.LocalWorker, "launch", recording_launch)
    with pytest.raises(runtime.WorkerError, match=r"TFF worker #0 \(pid \d+.*not ready after 1 s"):
        with runtime.local_runtime(num_workers=2, ready_timeout_s=1.0):
            pass
    assert len(started) == 2 and all(_gone(pid) for pid in started)


def _concurrency_flag(pid: int) -> str:
    (flag,) = [a for a in psutil.Process(pid).cmdline()
               if a.startswith("--max_concurrent_computation_calls=")]
    return flag.split("=", 1)[1]


def test_workers_run_one_client_per_core_by_default_and_take_a_given_limit():
    with runtime.local_runtime():
        (pid,) = runtime.running_workers()
        assert _concurrency_flag(pid) == str(os.cpu_count())
        assert _mean([1.0, 3.0]) == pytest.approx(2.0)
    with runtime.local_runtime(max_concurrent_calls=-1, num_workers=2):
        assert [_concurrency_flag(p) for p in runtime.running_workers()] == ["-1", "-1"]
    assert runtime.running_workers() == []
