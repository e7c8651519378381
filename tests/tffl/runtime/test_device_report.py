"""tffl.runtime: `--runtime=distribute` names, once per round kind, the devices its client steps
ran on; a TFF worker runtime started where TensorFlow sees a GPU says the worker runs on CPU."""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl import runtime
from tffl.runtime import distribute
from tffl.simulation import driver, participation


@tff.tensorflow.computation(np.float32)
def _double(x):
    return x * 2.0


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _sum_doubled(values):
    return tff.federated_sum(tff.federated_map(_double, values))


class _ClientStepsProcess:
    """A process whose `next` runs a client step (`federated_map`) on each client's number."""

    def initialize(self):
        return {"total": np.float32(0.0)}

    def next(self, state, datasets):
        values = [float(next(iter(ds)).numpy()) for ds in datasets]
        total = _sum_doubled(values)
        return {"total": np.float32(total)}, {"client_work": {"train": {"loss": 0.5}}}


def test_the_distribute_runtime_names_the_client_devices_once_per_round_kind(tmp_path, caplog):
    def data(cid, round_num):
        return tf.data.Dataset.from_tensor_slices(np.array([round_num], np.float32))

    caplog.set_level(logging.INFO, logger="tffl")
    with distribute.distribute_runtime("CPU:0") as context:
        result = driver.run_rounds(
            _ClientStepsProcess(), participation.FullParticipation(["a", "b"]), data, 3, tmp_path,
            driver.RunOptions(log=None, tensorboard=False))
    assert float(result.state["total"]) == 2.0 * 2 * 3  # round 3: two clients, 2 × 3 each
    device = context.devices[0]
    assert device.endswith("device:CPU:0")
    lines = [r.getMessage() for r in caplog.records if r.name == "tffl.runtime"]
    assert lines == [f"client steps of round kind 'next' ran on {device}"]


class _TwoDevices:
    """What `DistributeContext.round_devices` reads, for two replicas."""

    devices = ["/job:localhost/replica:0/task:0/device:CPU:0",
               "/job:localhost/replica:0/task:0/device:CPU:1"]

    def __init__(self):
        self._counted = dict.fromkeys(self.devices, 0)
        self._reported = set()
        self.clients_per_device = dict.fromkeys(self.devices, 0)


def test_each_round_kind_is_reported_once_with_the_devices_it_used():
    context = _TwoDevices()
    report = distribute.DistributeContext.round_devices
    assert report(context, "b_round") is None  # no client step ran yet (initialize)
    context.clients_per_device = dict(zip(context.devices, (3, 2)))
    assert report(context, "b_round") == (
        "client steps of round kind 'b_round' ran on /job:localhost/replica:0/task:0/device:"
        "CPU:0, /job:localhost/replica:0/task:0/device:CPU:1")
    context.clients_per_device = dict(zip(context.devices, (6, 2)))
    assert report(context, "a_round") == (
        "client steps of round kind 'a_round' ran on /job:localhost/replica:0/task:0/device:CPU:0")
    context.clients_per_device = dict(zip(context.devices, (9, 4)))
    assert report(context, "b_round") is None
    assert report(context, "a_round") is None


def test_the_worker_runtime_says_it_runs_on_cpu_when_tensorflow_sees_a_gpu(monkeypatch, caplog):
    gpus = [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
    listed = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: gpus if kind == "GPU" else listed(kind))
    note = runtime.gpu_note()
    assert note.startswith("TensorFlow sees 1 GPU, but the TFF worker runs on CPU")
    assert "--runtime=distribute" in note
    assert runtime.gpu_note(gpus=[]) is None

    class _NoWorker:
        def __init__(self, **kwargs):
            del kwargs

        def launch(self):
            raise RuntimeError("no worker in this test")

        def stop(self):
            pass

    monkeypatch.setattr(runtime, "LocalWorker", _NoWorker)
    caplog.set_level(logging.INFO, logger="tffl")
    with pytest.raises(RuntimeError, match="no worker"):
        with runtime.local_runtime():
            pass
    assert [r.getMessage() for r in caplog.records if r.name == "tffl.runtime"] == [note]
