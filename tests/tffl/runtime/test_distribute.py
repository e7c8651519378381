"""tffl.runtime.distribute: TFF computations run in-process under a tf.distribute strategy.

The parity test runs every algorithm for two rounds on the TFF worker (the reference) and on the
in-process runtime with `MirroredStrategy` over 2 logical CPU devices, and over 4 for one algorithm
of each kind of state and round (`FOUR_REPLICA_CASES`), in child processes
(tests/tffl/runtime/distribute_parity.py: TensorFlow's logical devices are fixed at its first
op), forked from a Python that has imported TensorFlow but run no op (tests/forked_python.py).
Every output leaf — the metrics and personal states of both rounds, and the final server state —
must agree within 1e-5. No machine here has TensorFlow on a GPU or TPU; logical CPU
devices are what the multi-replica paths were verified on.

Two replicas run with two clients at once per replica (three clients: the first replica's two in
parallel slots), four with one (one replica idle). A one-device `MirroredStrategy` is not swept:
its one replica is the first replica of the two-device run (same group cut, same SERVER device,
no copy), its default two slots on this machine's two cores are the two-device run's slots, and
the one-device path itself is `OneDeviceStrategy`'s, tested in-process below; it cost a third of
the sweep.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import forked_python
from tffl import runtime
from tffl.runtime import distribute, interpreter

HERE = pathlib.Path(__file__).resolve().parent
ALGORITHMS = (
    "rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora", "rolora_ffa",
    "fedrep", "fedper", "lg_fedavg", "fedavg", "fedavg_ft", "flute", "adaptpfl", "fedsa_lora",
    "fedrep_rolora", "fedrep_linear", "flute_linear", "adaptpfl_linear", "rolora_linear",
)
STRATEGIES = ("mirrored_2", "mirrored_4")  # distribute_parity.STRATEGIES
# distribute_parity.FOUR_REPLICA_CASES: one algorithm of each kind of state and round
FOUR_REPLICA_CASES = ("rolora", "flexlora", "flora", "fedrep", "fedsa_lora", "flute", "adaptpfl",
                      "rolora_linear", "fedrep_linear")
PAIRS = [(a, s) for a in ALGORITHMS for s in STRATEGIES
         if s == "mirrored_2" or a in FOUR_REPLICA_CASES]


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    """Two children at once (the test waits on both), sharing the algorithms: each runs the next
    one the other has not claimed, the slowest first."""
    folder = tmp_path_factory.mktemp("parity")
    (folder / "claims").mkdir()
    children = [forked_python.popen_script(
        HERE / "distribute_parity.py", str(folder / f"part{k}.npz"), str(folder / "claims"),
        *ALGORITHMS, stdout=subprocess.DEVNULL) for k in range(2)]
    results = {}
    for k, child in enumerate(children):
        _, stderr = child.communicate(timeout=1500)
        assert child.returncode == 0, stderr[-3000:]
        with np.load(folder / f"part{k}.npz") as data:
            results.update(data)
    return results


CLIENTS = {"flute": 2, "adaptpfl": 2, "fedrep_rolora": 2}  # the others have three clients


def _run(results, algorithm, label):
    leaves, i = [], 0
    while f"{algorithm}/{label}/{i}" in results:
        leaves.append(results[f"{algorithm}/{label}/{i}"])
        i += 1
    return leaves


def test_the_parity_child_covers_every_algorithm_train_py_offers():
    sys.path.insert(0, str(HERE.parents[2]))
    from runner import algorithms

    assert set(algorithms.KERAS_ALGORITHMS) <= set(ALGORITHMS)


@pytest.mark.large  # two children for about 3 minutes; the in-process tests below stay fast
@pytest.mark.parametrize("algorithm, strategy", PAIRS)
def test_two_rounds_match_the_tff_worker(parity, algorithm, strategy):
    reference = _run(parity, algorithm, "tff")
    got = _run(parity, algorithm, strategy)
    assert reference and len(got) == len(reference)
    numeric = 0
    for k, (g, r) in enumerate(zip(got, reference)):
        assert g.shape == r.shape, f"leaf {k}"
        if r.dtype.kind in "fiub":
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5, err_msg=f"leaf {k}")
            numeric += int(r.dtype.kind == "f")
        else:
            assert np.array_equal(g, r), f"leaf {k}"
    assert numeric > 0
    # Every replica that has a client ran clients (the groups are cut per replica).
    per_device = parity[f"{algorithm}/{strategy}:clients_per_device"]
    replicas = int(strategy.split("_")[1])
    assert len(per_device) == replicas
    assert np.count_nonzero(per_device) == min(replicas, CLIENTS.get(algorithm, 3))


def test_replica_groups_are_contiguous_and_balanced():
    groups = interpreter.replica_groups(7, 3)
    assert [list(g) for g in groups] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(g) for g in interpreter.replica_groups(2, 4)] == [[0], [1], [], []]


def test_a_tensorflow_computation_runs_its_own_graph_in_process():
    @tff.tensorflow.computation(tff.SequenceType(np.float32), tff.TensorType(np.float32))
    def weighted_sum(ds, w):
        return ds.reduce(np.float32(0.0), lambda a, x: a + x * w)

    fn = runtime.tf_functions.TensorFlowFunction.from_computation(weighted_sum)
    ds = tf.data.Dataset.from_tensor_slices(np.array([1.0, 2.0, 3.5], np.float32))
    assert float(fn(tff.structure.Struct.unnamed(ds, 2.0))) == pytest.approx(13.0)


def test_federated_mean_and_broadcast_in_process_equal_numpy():
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                               tff.FederatedType(np.float32, tff.SERVER))
    def round_trip(values, offset):
        shifted = tff.federated_map(
            tff.tensorflow.computation(lambda v, o: v + o),
            (values, tff.federated_broadcast(offset)))
        return tff.federated_mean(shifted), shifted

    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    with distribute.distribute_runtime("CPU:0") as context:  # OneDeviceStrategy
        assert isinstance(context.strategy, tf.distribute.OneDeviceStrategy)
        mean, shifted = round_trip(values, 0.5)
    assert float(mean) == pytest.approx(np.mean(values) + 0.5)
    np.testing.assert_allclose(shifted, np.array(values) + 0.5)


def test_results_fed_back_stay_on_the_device():
    """A round's state, passed back unchanged, is not uploaded again: the context reuses the
    device tensors it returned."""
    add = tff.tensorflow.computation(lambda x: x + 1.0, tff.TensorType(np.float32, [3]))
    with distribute.distribute_runtime("CPU:0") as context:
        first = add(np.zeros(3, np.float32))
        assert context.resident_reused == 0
        second = add(first)
        assert context.resident_reused == 1
    np.testing.assert_array_equal(second, [2.0, 2.0, 2.0])


def test_bad_devices_are_one_line_errors():
    with pytest.raises(distribute.DeviceError, match=r"device 'GPU:0' does not exist .*CPU:0"):
        distribute.build_strategy("GPU:0")
    with pytest.raises(distribute.DeviceError, match="given twice"):
        distribute.build_strategy("CPU:0,cpu:0")
    with pytest.raises(distribute.DeviceError, match="no TPU reachable.*TPUClusterResolver"):
        distribute.build_strategy("tpu")
    for bad in ("GPU:0", "tpu"):
        try:
            distribute.build_strategy(bad)
        except distribute.DeviceError as e:
            assert "\n" not in str(e)


def test_an_intrinsic_the_runtime_lacks_is_named():
    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def secure(values):
        return tff.federated_secure_sum_bitwidth(values, 8)

    with distribute.distribute_runtime("CPU:0"):
        with pytest.raises(interpreter.UnsupportedComputationError,
                           match="federated_secure_sum_bitwidth"):
            secure([1, 2, 3])
