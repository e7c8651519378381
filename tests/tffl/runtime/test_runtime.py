"""tffl.runtime: workers and owners that die. No worker outlives its owner (SIGINT, SIGTERM,
SIGKILL); a worker killed mid-computation is named at once, one that crashes is restarted and
the computation run again, and a run stopped by a killed worker resumes to the uninterrupted
result. Starting, splitting and stopping workers: test_runtime_workers.py; SIGTERM in the owner:
test_runtime_signals.py.

The owners are children forked from a Python that has imported TFF (tests/forked_python.py), not
`python -c` runs that would spend most of each test importing it; the in-process tests come
first, while that Python imports."""

import functools
import os
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.simulation import checkpoint
from tffl.algorithms import lora_fl
from tffl.simulation import participation
from tffl.engine import roles
from tffl import runtime
from tffl.runtime import worker_connection
from tffl.runtime import workers as workers_lib
from tffl.simulation import driver
from tffl.simulation import metrics_log
from tests import forked_python
from tests.tffl.runtime.runtime_helpers import gone


@pytest.fixture(scope="module", autouse=True)
def _start_the_zygote_early(request):
    """Starts the owners' zygote at the module's first test if a test of it will need it."""
    if any("zygote" in item.fixturenames for item in request.session.items
           if getattr(item, "module", None) is request.module):  # DoctestItems have none
        forked_python.start()


@pytest.fixture
def zygote() -> forked_python.Zygote:
    zygote = forked_python.start()
    zygote.wait_ready()
    return zygote


# --- Workers killed or crashed mid-computation -------------------------------------------------


@tff.tensorflow.computation(np.int32)
def _spin(n):
    """A loop of n scalar steps: n·2 µs of CPU on a quiet machine, up to n·8 µs on a loaded one."""
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
        victim = psutil.Process(workers_lib.running_workers()[-1] if workers == 1
                                else context.workers[1].pid)
        busy = sum(victim.cpu_times()[:2]) + 0.3
        killed_at = []

        def kill_when_busy():  # once the worker has computed for 0.3 s of CPU time
            while sum(victim.cpu_times()[:2]) < busy:
                time.sleep(0.02)
            victim.kill()
            killed_at.append(time.monotonic())

        threading.Thread(target=kill_when_busy, daemon=True).start()
        with pytest.raises(worker_connection.WorkerError, match=rf"TFF worker #{workers - 1} \(pid "
                           rf"{victim.pid}.*killed by SIGKILL while running a computation"):
            _slow_sum([3_000_000] * 4)  # seconds of CPU per client
        assert killed_at and time.monotonic() - killed_at[0] < 15
    assert workers_lib.running_workers() == []


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


@pytest.mark.large  # the fast tier kills a worker (above) and crashes one twice (below)
@pytest.mark.parametrize("workers", [1, 2])
def test_crashed_worker_is_restarted_and_the_computation_run_again(tmp_path, workers, caplog):
    """A worker that crashes (SIGSEGV) mid-computation is replaced and the computation run again:
    its result is the undisturbed one. External kills still end the run (tests above)."""
    # 0.4 s of CPU per client on a quiet machine, 1.5 s on a loaded one: the crash comes at 0.3 s
    # of the run's 1.6-6 s, the worker's CPU time, whatever the wall clock does.
    steps = [200_000] * 4
    with runtime.local_runtime(log_dir=tmp_path, num_workers=workers) as context:
        signalled = _crash_when_busy(context, times=1)
        with caplog.at_level("WARNING", logger="tffl.runtime"):
            crashed_run = _slow_sum(steps)
        assert len(signalled) == 1 and signalled[0] not in workers_lib.running_workers()
        assert len(workers_lib.running_workers()) == workers
        assert context.workers[-1].generation == 1 and context.workers[0].generation == (
            0 if workers == 2 else 1)
        assert f"pid {signalled[0]}" in caplog.text and "crashed; restarted as" in caplog.text
        assert crashed_run == _slow_sum(steps)  # an undisturbed run, on the restarted worker
    assert workers_lib.running_workers() == []


def test_worker_that_crashes_again_after_its_restart_ends_the_run(tmp_path):
    with runtime.local_runtime(log_dir=tmp_path) as context:
        signalled = _crash_when_busy(context, times=2)
        with pytest.raises(worker_connection.WorkerError,
                           match=r"killed by SIGSEGV while running a "
                           r"computation \(on the second run, after a restart that followed: "
                           r"TFF worker #0 \(pid \d+.*killed by SIGSEGV"):
            _slow_sum([3_000_000] * 4)
        assert len(signalled) == 2
    assert workers_lib.running_workers() == []



# --- A run on workers, stopped by a killed worker and resumed ----------------------------------


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


@functools.cache  # one process per algorithm for the module: its computations are traced once
def _process(name):
    spec = (tf.TensorSpec([None, _D_IN], tf.float32), tf.TensorSpec([None, _D_OUT], tf.float32))
    return lora_fl.build_lora_process(name, _model_fn, spec, 0.1,
                                      loss_fn=tf.keras.losses.MeanSquaredError)


def _client_dataset(client_id, round_num):
    return tf.data.Dataset.from_tensor_slices(_CLIENT_DATA[client_id]).batch(2)


_ROUNDS = 3


def _run(process, output_dir, resume=False):
    return driver.run_rounds(
        process, participation.UniformSampler(sorted(_CLIENT_DATA), 4, seed=1), _client_dataset,
        _ROUNDS, output_dir, driver.RunOptions(resume=resume, log=None))


def _rows(output_dir):
    drop = set(metrics_log.MACHINE_COLUMNS)
    return [{k: v for k, v in row.items() if k not in drop}
            for row in metrics_log.read_metrics(output_dir / driver.METRICS_FILE)]


def _assert_same_run(a, b, rtol=1e-5, atol=1e-6):
    """Same final state and metrics rows, up to float rounding."""
    for x, y in zip(tf.nest.flatten(a.state), tf.nest.flatten(b.state), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
    assert [r["round"] for r in a.history] == [r["round"] for r in b.history]
    for row_a, row_b in zip(a.history, b.history):
        assert set(row_a) == set(row_b)
        for key in set(row_a) - set(metrics_log.MACHINE_COLUMNS):
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
            assert workers_lib.running_workers() == []
        return runs[algorithm, workers]

    return get


@pytest.mark.large  # the fast tier's killed-worker run below resumes on two workers
@pytest.mark.parametrize("algorithm", ["fedavg_lora", "rolora"])
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
            assert gone(pid)  # dead (a zombie until the runtime reaps it)
        return next_round(state, data)

    process.next_round = killing_next_round
    return process


def test_killed_worker_stops_the_run_and_resume_matches(reference_runs, tmp_path):
    process = _process("rolora")
    with runtime.local_runtime(log_dir=tmp_path / "logs", num_workers=2) as context:
        victim = context.workers[1]
        try:
            with pytest.raises(worker_connection.WorkerError) as error:
                _run(_kills_a_worker(process, victim.pid, at=3), tmp_path / "run")
        finally:
            del process.next_round  # the method again (the process is the module's)
    message = str(error.value)
    assert f"TFF worker #1 (pid {victim.pid}, {victim.address}" in message
    assert "killed by SIGKILL" in message and str(tmp_path / "logs" / "tff_worker_1.log") in message
    assert workers_lib.running_workers() == []
    assert checkpoint.latest(tmp_path / "run" / driver.CHECKPOINT_DIR)[0] == 2

    with runtime.local_runtime(num_workers=2):
        resumed = _run(process, tmp_path / "run", resume=True)
    assert resumed.first_round == 3
    _assert_same_run(resumed, reference_runs("rolora", 2), rtol=1e-6, atol=1e-7)
    assert _rows(tmp_path / "run") == [
        {k: v for k, v in r.items() if k not in metrics_log.MACHINE_COLUMNS}
        for r in reference_runs("rolora", 2).history]


# --- Owners killed ----------------------------------------------------------------------------


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import tensorflow_federated as tff
    from tffl import runtime
    from tffl.runtime import workers as workers_lib

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(values):
        return tff.federated_mean(values)

    with runtime.local_runtime(num_workers=int(sys.argv[1])):
        mean([1.0, 2.0, 3.0])
        print("READY", *workers_lib.running_workers(), flush=True)
        time.sleep(120)
    """
)


# The fast tier kills the owner one way; the large tier every way (tests in tiers: README).
@pytest.mark.parametrize("sig, workers", [
    (signal.SIGINT, 1), pytest.param(signal.SIGTERM, 1, marks=pytest.mark.large),
    pytest.param(signal.SIGKILL, 1, marks=pytest.mark.large), pytest.param(signal.SIGKILL, 2, marks=pytest.mark.large),
])
def test_no_worker_outlives_a_killed_owner(zygote, sig, workers):
    """SIGINT/SIGTERM run the teardown; SIGKILL is covered by PR_SET_PDEATHSIG."""
    # The child takes SIGINT as a user's Ctrl-C, a KeyboardInterrupt, even where pytest runs as
    # a background job of a shell without job control (started with SIGINT ignored).
    proc = zygote.spawn(_CHILD, str(workers), stderr=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"child did not start: {line!r}"
        worker_pids = [int(pid) for pid in line.split()[1:]]
        assert len(worker_pids) == workers
        assert not any(gone(pid, timeout_s=0.2) for pid in worker_pids)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        for pid in worker_pids:
            assert gone(pid), f"worker {pid} outlived its owner after {sig.name}"
        # The workers held no copy of our pipe: reading to EOF returns instead of hanging.
        assert proc.stdout.read() is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM

