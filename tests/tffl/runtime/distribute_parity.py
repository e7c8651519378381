"""Child of tests/tffl/runtime/test_distribute.py: every algorithm for two rounds on the TFF worker and on
the in-process runtime over 2 logical CPU devices, and over 4 for one algorithm of each kind
(`FOUR_REPLICA_CASES`); writes every output leaf to an .npz.

TensorFlow's logical devices are fixed when it first runs an op, so this runs in its own process:
the host CPU is split into 4 logical devices first, and the strategies use the first 2 or 4
(`MirroredStrategy` over each set; see `STRATEGIES`).

Several children share the list: each runs an algorithm only if it is the first to claim it in
CLAIMS_DIR (an empty folder they share), heaviest first (`HEAVIEST_FIRST`), so that they finish
together whatever the machine's load.

    python tests/tffl/runtime/distribute_parity.py OUT.npz CLAIMS_DIR [algorithm ...]
"""

import collections
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "algorithms"), str(HERE.parents[1]), str(HERE.parents[2])]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import conftest  # noqa: E402,F401  (frozen-weights files to a temporary folder)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tffl import runtime  # noqa: E402
from tffl.runtime import distribute

DEVICES = distribute.configure_logical_cpus(4)

import test_adaptpfl_linear  # noqa: E402
import test_flute_linear  # noqa: E402
import test_fedrep_linear  # noqa: E402
import lora_linear  # noqa: E402
import personalized_models as pers  # noqa: E402
from tasks.synthetic import rolora_linear  # noqa: E402
from tffl.algorithms import adaptpfl_linear  # noqa: E402
from tffl.algorithms import fedrep_linear  # noqa: E402
from tffl.algorithms import flute_linear  # noqa: E402
from tffl.algorithms import lora_fl  # noqa: E402
from tffl.algorithms import lora_plans  # noqa: E402
from tffl.algorithms import personalized  # noqa: E402
from tffl.algorithms import rolora_linear as rolora_linear_lib  # noqa: E402

ROUNDS = 2


def _linear_lora(link=False):
    """tests/tffl/algorithms/lora_linear.py's LoRA model function (W0, A0) and input spec."""
    return (lora_linear.linear_model_fn([(lora_linear.W0, lora_linear.A0)], link=link),
            lora_linear.linear_spec(lora_linear.D_IN, lora_linear.D_OUT))


def _linear_datasets():
    return lora_linear.client_datasets(lora_linear.CLIENTS, lora_linear.BATCH)


def _lora(name):
    if name == "flora":
        process = lora_fl.build_lora_process(
            name, *_linear_lora(link=True),
            lora_linear.LR, loss_fn=tf.keras.losses.MeanSquaredError)
    elif name == "rolora_ffa":
        process = lora_fl.build_rolora_then_ffa(
            0.5, 4, *_linear_lora(),
            lora_linear.LR, loss_fn=tf.keras.losses.MeanSquaredError)
    else:
        process = lora_linear.small_process(name)
    return process, _linear_datasets, None


def _personalized(name):
    if name in ("flute", "adaptpfl"):
        model_fn = ((lambda: pers.classifier(shortcut_alpha=0.5)) if name == "adaptpfl"
                    else pers.classifier)
        process = personalized.build_personalized_process(name, model_fn, pers.CLASS_SPEC, pers.LR)
        clients = pers.class_clients(seed=0)
        data = lambda: pers.full_batch_datasets(clients)  # noqa: E731
    elif name == "fedsa_lora":
        process = personalized.build_personalized_process(
            name, *_linear_lora(),
            lora_linear.LR, loss_fn=tf.keras.losses.MeanSquaredError)
        data = _linear_datasets
    elif name == "fedrep_rolora":  # FedRep heads over RoLoRA-alternated adapters, KerasNLP BERT
        x_spec = collections.OrderedDict(
            padding_mask=tf.TensorSpec([None, 8], tf.int32),
            segment_ids=tf.TensorSpec([None, 8], tf.int32),
            token_ids=tf.TensorSpec([None, 8], tf.int32))
        process = personalized.build_personalized_process(
            "fedrep", pers.lora_classifier, (x_spec, tf.TensorSpec([None], tf.int32)), 0.5,
            lora_schedule="alternating")

        def data():
            def dataset(seed):
                r = np.random.default_rng(seed)
                x = collections.OrderedDict(
                    padding_mask=np.ones((6, 8), np.int32), segment_ids=np.zeros((6, 8), np.int32),
                    token_ids=r.integers(1, 50, (6, 8)).astype(np.int32))
                return tf.data.Dataset.from_tensor_slices(
                    (x, r.integers(0, 3, 6).astype(np.int32))).batch(3)
            return [dataset(s) for s in (1, 2)]
    else:
        process = pers.build(name, local_epochs=2) if name != "fedrep" else pers.build(
            name, head_epochs=2, representation_epochs=2)
        clients = pers.linear_clients()
        data = lambda: pers.full_batch_datasets(clients)  # noqa: E731
    personal = ([process.initialize_personal(str(i)) for i in range(len(data()))]
                if process.personal is not None else None)
    return process, data, personal


def _linear(name):
    if name == "rolora_linear":  # RoLoRA's Algorithm 2 (a B round and an A round)
        problem = rolora_linear(num_clients=3, num_samples=12, dim=5, heterogeneity=0.5, seed=0)
        clients = [dict(x=problem.features[i].astype(np.float32),
                        y=problem.targets[i].astype(np.float32)) for i in range(3)]
        return rolora_linear_lib.build_rolora_alt_min_gd(5, 0.3), lambda: clients, None
    if name == "fedrep_linear":
        process = fedrep_linear.build_fedrep_linear(test_fedrep_linear._D, test_fedrep_linear._K, 0.3)
        return process, lambda: test_fedrep_linear._CLIENTS, None
    if name == "flute_linear":
        m = test_flute_linear
        process = flute_linear.build_flute_linear(m._D, m._K, learning_rate=0.1)
        return process, lambda: m._CLIENTS, [process.initialize_personal(str(i)) for i in range(3)]
    m = test_adaptpfl_linear
    process = adaptpfl_linear.build_adaptpfl_linear(adaptpfl_linear.AdaptPFLLinearConfig(
        m._D, m._K, alpha=0.3, learning_rate=0.1, seed=2))
    return process, lambda: m._CLIENTS, [process.initialize_personal(str(i)) for i in range(3)]


CASES = {
    **{name: (lambda n=name: _lora(n))
       for name in (*lora_plans.FIXED_SCHEDULE_ALGORITHMS, "rolora_ffa")},
    **{name: (lambda n=name: _personalized(n)) for name in (*personalized.PERSONALIZED_ALGORITHMS,
                                                             "fedrep_rolora")},
    **{name: (lambda n=name: _linear(n)) for name in ("fedrep_linear", "flute_linear",
                                                      "adaptpfl_linear", "rolora_linear")},
}


def _leaves(value) -> list[np.ndarray]:
    if hasattr(value, "_asdict"):
        value = value._asdict()
    try:
        value = tff.structure.from_container(value, recursive=True)
    except TypeError:
        pass
    return [np.asarray(v) for v in tff.structure.flatten(value)]


def _two_rounds(process, data, personal) -> list[np.ndarray]:
    state = process.initialize()
    leaves = []
    for _ in range(ROUNDS):
        step = getattr(process, "next_round", process.next)  # one communication round
        if personal is None:
            out = step(state, data())
        else:
            out = step(state, data(), personal)
            personal = out.personal_states
            leaves += [leaf for p in personal for leaf in _leaves(p)]
        state = out.state
        leaves += _leaves(out.metrics)
    return leaves + _leaves(state)


# (label, devices, clients each replica trains at once). Two replicas with two slots each: with
# three clients the first replica trains two at once, each slot its own instance of every
# function (the `clients_in_parallel` path, which the default gives only when the cores outnumber
# the replicas); four replicas with one slot: one replica has no client.
STRATEGIES = (("mirrored_2", 2, 2), ("mirrored_4", 4, 1))
# What four replicas add to two (an idle replica, one slot each) depends on the algorithm's
# state and rounds, not on its name: they run one algorithm of each kind of state and round (LoRA
# B/A rounds, FlexLoRA's SVD and FLoRA's merge on the server, personal heads, personal LoRA B,
# FLUTE's and AdaptPFL's personal states, the linear engine's rounds); two replicas run all.
FOUR_REPLICA_CASES = ("rolora", "flexlora", "flora", "fedrep", "fedsa_lora", "flute", "adaptpfl",
                      "rolora_linear", "fedrep_linear")
# The slowest algorithms (measured: the KerasNLP BERT one takes a quarter of the sweep), claimed
# first; the others follow in the order given.
HEAVIEST_FIRST = ("fedrep_rolora", "rolora", "flute", "fedrep", "rolora_ffa", "adaptpfl",
                  "rolora_linear", "adaptpfl_linear", "flute_linear")


def _claimed(claims: pathlib.Path, names: list[str]):
    """The names this child is the first to claim (an exclusive create in `claims`)."""
    order = sorted(names, key=lambda n: HEAVIEST_FIRST.index(n) if n in HEAVIEST_FIRST
                   else len(HEAVIEST_FIRST))
    for name in order:
        try:
            os.close(os.open(claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        yield name


def _parity(name: str) -> dict[str, np.ndarray]:
    """`name`'s two rounds on the installed TFF worker context, then under each strategy."""
    built = CASES[name]()
    results = {f"{name}/tff/{i}": leaf for i, leaf in enumerate(_two_rounds(*built))}
    for label, count, parallel in STRATEGIES:
        if count == 4 and name not in FOUR_REPLICA_CASES:
            continue
        strategy = tf.distribute.MirroredStrategy(
            DEVICES[:count], cross_device_ops=tf.distribute.ReductionToOneDevice())
        with distribute.distribute_runtime(strategy=strategy,
                                        clients_in_parallel=parallel) as context:
            got = _two_rounds(*built)
        results[f"{name}/{label}:clients_per_device"] = np.array(
            list(context.clients_per_device.values()))
        results.update({f"{name}/{label}/{i}": leaf for i, leaf in enumerate(got)})
    return results


def main(out_path: str, claims: str, names: list[str]) -> None:
    results = {}
    with runtime.local_runtime():  # one TFF worker for every reference run
        for name in _claimed(pathlib.Path(claims), names or list(CASES)):
            started = time.monotonic()
            results.update(_parity(name))
            print(name, f"done in {time.monotonic() - started:.0f} s", flush=True)
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
