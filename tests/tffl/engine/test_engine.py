"""tffl.engine.rounds / tffl.engine.process: the one engine against TFF's own FedAvg and independent numpy.

- FedAvg on the engine equals `tff.learning.algorithms.build_weighted_fed_avg` on the same Keras
  model and data (3 rounds, 1e-6).
- Only federated variables are broadcast: read off each round's MapReduceForm `prepare` (what the
  server sends), for every LoRA algorithm; FLoRA adds exactly the base kernel it merges into.
- RoLoRA's B and A rounds train on different batches (the driver feeds each communication round
  its own data), checked against numpy SGD on those batches.
- Client SGD with momentum and weight decay, client Adam and a server SGD step, against numpy.
- Checkpoints carry the frozen weights' fingerprint; resuming on other frozen weights is refused.
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.lora_linear import LinearLora, local_sgd, weighted_mean
from tests.tiers import tiered
from tffl.engine import frozen
from tffl.engine import model_spec
from tffl.algorithms import lora_fl
from tffl.algorithms import lora_plans
from tffl.simulation import participation
from tffl.algorithms import personalized
from tffl.simulation import driver

_RNG = np.random.default_rng(11)
_D_IN, _D_OUT, _R = 4, 3, 2
_W0 = _RNG.normal(size=(_D_IN, _D_OUT)).astype(np.float32)
_A0 = _RNG.normal(size=(_D_IN, _R)).astype(np.float32)
_CLIENTS = [(_RNG.normal(size=(n, _D_IN)).astype(np.float32),
             _RNG.normal(size=(n, _D_OUT)).astype(np.float32)) for n in (4, 6, 2)]
_COUNTS = [len(x) for x, _ in _CLIENTS]
_LR, _BATCH = 0.1, 2
_SPEC = (tf.TensorSpec([None, _D_IN], tf.float32), tf.TensorSpec([None, _D_OUT], tf.float32))


def _lora_model(w0=_W0, link=False):
    def build():
        x = tf.keras.Input((_D_IN,))
        return tf.keras.Model(x, LinearLora(w0, _A0, link=link, name="lora_0")(x))

    return build


def _datasets(clients, batch=_BATCH):
    return [tf.data.Dataset.from_tensor_slices(c).batch(batch) for c in clients]


# --- FedAvg equals TFF's own ------------------------------------------------------------------

_CLASSES, _FEATURES = 3, 5
_CLASS_CLIENTS = [(_RNG.normal(size=(n, _FEATURES)).astype(np.float32),
                   _RNG.integers(0, _CLASSES, size=n).astype(np.int32)) for n in (7, 4, 9)]
_CLASS_SPEC = (tf.TensorSpec([None, _FEATURES], tf.float32), tf.TensorSpec([None], tf.int32))


def _mlp():
    x = tf.keras.Input((_FEATURES,))
    h = tf.keras.layers.Dense(6, activation="relu",
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))(x)
    y = tf.keras.layers.Dense(_CLASSES,
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))(h)
    return tf.keras.Model(x, y)


def test_fedavg_equals_tff_build_weighted_fed_avg(tff_runtime):
    """3 rounds of FedAvg (client SGD 0.1, batch 3, example-weighted mean, server SGD 1.0) on the
    engine and with `tff.learning.algorithms.build_weighted_fed_avg`, from the same weights."""
    ours = personalized.build_personalized_process("fedavg", _mlp, _CLASS_SPEC, 0.1)

    def tff_model_fn():
        return tff.learning.models.from_keras_model(
            _mlp(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=_CLASS_SPEC)

    theirs = tff.learning.algorithms.build_weighted_fed_avg(
        tff_model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    state = ours.initialize()
    weights = ours.get_model_weights(state)
    assert len(weights.trainable) == 4 and not weights.non_trainable  # everything is federated
    their_state = theirs.set_model_weights(theirs.initialize(), weights)
    data = _datasets(_CLASS_CLIENTS, 3)
    for _ in range(3):
        output = ours.next(state, data)
        state = output.state
        their_state = theirs.next(their_state, data).state
    for a, b in zip(ours.get_model_weights(state).trainable,
                    theirs.get_model_weights(their_state).trainable, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert output.metrics["client_work"]["train"]["num_examples"] == sum(
        len(x) for x, _ in _CLASS_CLIENTS)


# --- Only federated variables travel ----------------------------------------------------------

def _frozen_below_lora(link):
    """x (4) -> Dense(6) [frozen: kernel (4, 6), bias (6,)] -> LoRA layer W0 (6, 3) [frozen,
    linked when `link`], A (6, 2), B (2, 3)."""
    w0 = np.random.default_rng(0).normal(size=(6, _D_OUT)).astype(np.float32)
    a0 = np.random.default_rng(1).normal(size=(6, _R)).astype(np.float32)

    def build():
        x = tf.keras.Input((_D_IN,))
        dense = tf.keras.layers.Dense(6, trainable=False)
        return tf.keras.Model(x, LinearLora(w0, a0, link=link, name="lora")(dense(x)))

    return build


def _broadcast_shapes(computation):
    form = tff.backends.mapreduce.get_map_reduce_form_for_computation(computation)
    leaves = tff.structure.flatten(form.prepare.type_signature.result)
    return sorted(tuple(t.shape) for t in leaves)


# Fast tier: RoLoRA's two round kinds and FLoRA's extra kernel; large: the others.
@pytest.mark.parametrize("algorithm", tiered([*lora_plans.FIXED_SCHEDULE_ALGORITHMS, "rolora_ffa"],
                                             fast=["rolora", "flora"]))
def test_no_frozen_variable_is_broadcast(algorithm, tff_runtime):
    """The broadcast (MapReduceForm `prepare`'s result) of every round holds exactly the
    federated variables: A (6, 2) and/or B (2, 3); FLoRA also the kernel W0 (6, 3) it merges
    into. The frozen Dense kernel (4, 6) and bias (6,) never travel."""
    link = algorithm == "flora"
    if algorithm == "rolora_ffa":
        process = lora_fl.build_rolora_then_ffa(0.5, 4, _frozen_below_lora(link), _SPEC, 0.1,
                                                loss_fn=tf.keras.losses.MeanSquaredError)
    else:
        process = lora_fl.build_lora_process(algorithm, _frozen_below_lora(link), _SPEC, 0.1,
                                             loss_fn=tf.keras.losses.MeanSquaredError)
    # RoLoRA→FFA's switch round also broadcasts the round number (int32 scalar).
    expected = {"ffa_lora": [(2, 3)], "flora": [(2, 3), (6, 2), (6, 3)],
                "rolora_ffa": [(), (2, 3), (6, 2)]}.get(algorithm, [(2, 3), (6, 2)])
    for name, computation in process.rounds.items():
        shapes = _broadcast_shapes(computation)
        assert shapes == expected, (name, shapes)
        assert process.traffic[name].down == 4 * sum(int(np.prod(s)) for s in expected)
    full = process.model_weights(process.initialize())
    assert [w.shape for w in full.non_trainable][:2] == [(4, 6), (6,)]  # frozen, in the file


# --- RoLoRA's rounds see their own data -------------------------------------------------------

def test_rolora_b_and_a_rounds_train_on_different_batches(tff_runtime, tmp_path):
    """`run_rounds` feeds communication round t the data `client_dataset_fn(cid, t)`: the B round
    (t = 1) trains on one set of batches, the A round (t = 2) on another; numpy SGD on exactly
    those batches gives the final factors (and using round 1's data for the A round would not)."""
    process = lora_fl.build_rolora(_lora_model(), _SPEC, _LR,
                                   loss_fn=tf.keras.losses.MeanSquaredError)
    rng = np.random.default_rng(5)
    data = {(f"c{i}", t): (rng.normal(size=(4, _D_IN)).astype(np.float32),
                           rng.normal(size=(4, _D_OUT)).astype(np.float32))
            for i in range(3) for t in (1, 2)}
    ids = ["c0", "c1", "c2"]
    seen = []

    def client_dataset_fn(cid, round_num):
        seen.append((cid, round_num))
        return tf.data.Dataset.from_tensor_slices(data[cid, round_num]).batch(_BATCH)

    result = driver.run_rounds(
        process, participation.FullParticipation(ids), client_dataset_fn, 2, tmp_path,
        driver.RunOptions(log=None))
    assert seen == [(c, 1) for c in ids] + [(c, 2) for c in ids]
    assert [r["communication_rounds"] for r in result.history] == [1, 2]
    assert "b_round/client_work/train/loss" in result.history[0]
    assert "a_round/client_work/train/loss" in result.history[1]
    # The TFF worker `tff_runtime` started is measured beside this process (tffl.simulation.memory).
    assert result.history[1]["worker_peak_rss_mb"] > 10 < result.history[1]["peak_rss_mb"]
    a_new, b_new = process.model_weights(result.state).trainable
    zeros = np.zeros((_R, _D_OUT))
    b_bar = weighted_mean([local_sgd(_A0, zeros, _W0, *data[c, 1], _LR, _BATCH, "b")[1]
                            for c in ids], [4, 4, 4])
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-6)
    a_bar = weighted_mean([local_sgd(_A0, b_bar, _W0, *data[c, 2], _LR, _BATCH, "a")[0]
                            for c in ids], [4, 4, 4])
    np.testing.assert_allclose(a_new, a_bar, rtol=1e-5, atol=1e-5)
    same_data = weighted_mean([local_sgd(_A0, b_bar, _W0, *data[c, 1], _LR, _BATCH, "a")[0]
                                for c in ids], [4, 4, 4])
    assert np.abs(same_data - a_bar).max() > 1e-3


# --- Optimizers from tff.learning.optimizers --------------------------------------------------

def _b_gradients(a, b, x, y):
    g = 2.0 / y.size * (x @ _W0 + x @ a @ b - y)
    return (x @ a).T @ g


def test_client_sgd_momentum_weight_decay_and_adam_match_numpy(tff_runtime):
    """FFA-LoRA, one client, B from 0: SGD with momentum β and weight decay λ
    (v ← βv + ∇ + λB, B ← B − ηv) and Adam (m, v moments, η_t = η√(1−β2^t)/(1−β1^t),
    B ← B − η_t·m/(√v + ε)), each against numpy; the server averages (one client: B_1)."""
    x, y = _CLIENTS[1]
    beta, lam = 0.9, 0.01
    sgdm = lora_fl.build_ffa_lora(_lora_model(), _SPEC,
                                  tff.learning.optimizers.build_sgdm(_LR, momentum=beta),
                                  weight_decay=lam, loss_fn=tf.keras.losses.MeanSquaredError)
    adam = lora_fl.build_ffa_lora(_lora_model(), _SPEC, tff.learning.optimizers.build_adam(0.05),
                                  loss_fn=tf.keras.losses.MeanSquaredError)
    got = {name: p.model_weights(p.next(p.initialize(), _datasets([(x, y)])).state).trainable[1]
           for name, p in (("sgdm", sgdm), ("adam", adam))}

    a = _A0.astype(np.float64)
    b, v = np.zeros((_R, _D_OUT)), np.zeros((_R, _D_OUT))
    for s in range(0, len(x), _BATCH):
        v = beta * v + _b_gradients(a, b, x[s:s + _BATCH], y[s:s + _BATCH]) + lam * b
        b = b - _LR * v
    np.testing.assert_allclose(got["sgdm"], b, rtol=1e-5, atol=1e-6)

    b, m, v = np.zeros((_R, _D_OUT)), np.zeros((_R, _D_OUT)), np.zeros((_R, _D_OUT))
    for t, s in enumerate(range(0, len(x), _BATCH), start=1):
        g = _b_gradients(a, b, x[s:s + _BATCH], y[s:s + _BATCH])
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        b = b - 0.05 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(got["adam"], b, rtol=1e-5, atol=1e-6)


def test_server_sgd_step_scales_the_mean_delta(tff_runtime):
    """Server SGD with η_s = 0.5 on FedAvg-LoRA: A ← A0 + 0.5·mean(A_i − A0), likewise B."""
    process = lora_fl.build_fedavg_lora(
        _lora_model(), _SPEC, _LR, loss_fn=tf.keras.losses.MeanSquaredError,
        server_optimizer=tff.learning.optimizers.build_sgdm(0.5))
    a_new, b_new = process.model_weights(
        process.next_round(process.initialize(), _datasets(_CLIENTS)).state).trainable
    local = [local_sgd(_A0, np.zeros((_R, _D_OUT)), _W0, x, y, _LR, _BATCH, "ab")
             for x, y in _CLIENTS]
    np.testing.assert_allclose(a_new, _A0 + 0.5 * (weighted_mean([a for a, _ in local], _COUNTS)
                                                   - _A0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b_new, 0.5 * weighted_mean([b for _, b in local], _COUNTS),
                               rtol=1e-5, atol=1e-6)


# --- Frozen weights: file, fingerprint, resume ------------------------------------------------

def test_frozen_weights_round_trip_and_fingerprint(tmp_path):
    values = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.int32)]
    written = frozen.FrozenWeights.write(values, tmp_path)
    assert written.fingerprint == frozen.fingerprint(values)
    assert frozen.FrozenWeights.write(values, tmp_path) == written   # content-addressed, reused
    for got, want in zip(written.load(), values, strict=True):
        np.testing.assert_array_equal(got, want)
    other = frozen.FrozenWeights.write([values[0] + 1, values[1]], tmp_path)
    assert other.fingerprint != written.fingerprint
    # The fingerprint is SHA-256 over each value's shape, dtype and bytes, in order.
    import hashlib

    digest = hashlib.sha256()
    for value in values:
        digest.update(f"{value.shape}|{value.dtype.str}|".encode() + value.tobytes())
    assert written.fingerprint == digest.hexdigest()[:16]


def test_a_base_by_reference_is_read_where_used_and_assigned_once(tmp_path, monkeypatch):
    values = [np.arange(6, dtype=np.float32).reshape(3, 2), np.full(2, 0.5, np.float32)]
    written = frozen.FrozenWeights.write(values, tmp_path)
    (restore_all,) = [t.numpy() for t in written.restore()[:1]]
    np.testing.assert_array_equal(restore_all, values[0])   # the merged bundles, read whole
    by_reference = written.values()
    assert [v.shape for v in by_reference] == [(3, 2), (2,)]
    for value, want in zip(by_reference, values):
        np.testing.assert_array_equal(np.asarray(value), want)
        np.testing.assert_array_equal(tf.convert_to_tensor(value).numpy(), want)
    reads = []
    restore_one = frozen.FrozenWeights.restore_one
    monkeypatch.setattr(frozen.FrozenWeights, "restore_one",
                        lambda self, k: reads.append(k) or restore_one(self, k))
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,)),
                                 tf.keras.layers.Dense(1)])
    model.layers[0].trainable = False   # kernel and bias: non-trainable
    head = [np.ones((2, 1), np.float32), np.zeros(1, np.float32)]
    weights = tff.learning.models.ModelWeights(head, [by_reference[0], values[1]])
    frozen.assign_weights(weights, model)
    frozen.assign_weights(weights._replace(trainable=[2 * head[0], head[1]]), model)
    assert reads == [0]   # the base read once; the trained head assigned both times
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), values[0])
    np.testing.assert_array_equal(model.layers[1].kernel.numpy(), 2 * head[0])
    frozen.assign_weights(weights._replace(non_trainable=[values[0] + 1, values[1]]), model)
    frozen.assign_weights(weights, model)   # another value came between: read again
    assert reads == [0, 0]
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), values[0])
    with pytest.raises(ValueError, match="the model has 4 weights, got 2 values"):
        frozen.assign_weights(tff.learning.models.ModelWeights(head, []), model)
    import shutil

    shutil.rmtree(pathlib.Path(written.prefix).parent)   # a cleaned cache: one line, the file
    with pytest.raises(FileNotFoundError, match=r"weights\.index are missing"):
        np.asarray(written.values()[1])


def test_initial_values_draw_only_the_asked_part():
    """A part not drawn is None, and the drawn part's values are what a whole draw gives
    (each variable's initializer is its own op, seeded here)."""
    def model_fn():
        x = tf.keras.Input((3,))
        frozen_layer = tf.keras.layers.Dense(
            4, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3), name="frozen")
        frozen_layer.trainable = False
        head = tf.keras.layers.Dense(
            2, kernel_initializer=tf.keras.initializers.RandomNormal(seed=5), name="head")
        return tf.keras.Model(x, head(frozen_layer(x)))

    spec = tf.TensorSpec([None, 3], tf.float32)
    whole = frozen.initial_values(model_fn, spec)
    only_trainable = frozen.initial_values(model_fn, spec, draw_non_trainable=False)
    only_frozen = frozen.initial_values(model_fn, spec, draw_trainable=False)
    assert only_trainable[1] is None and only_frozen[0] is None
    assert [v.shape for v in whole[0]] == [(4, 2), (2,)]
    assert [v.shape for v in whole[1]] == [(3, 4), (4,)]
    for got, want in zip(only_trainable[0] + only_frozen[1], whole[0] + whole[1], strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.abs(whole[0][0]).sum() > 0 and np.abs(whole[1][0]).sum() > 0   # really drawn


def test_graph_building_gives_the_model_keras_session_reads_would():
    """A KerasNLP backbone built in a graph under `model_spec.graph_building` (as `build_model`
    and `initial_values` build it: its constants read from their ops, not by Keras's session)
    draws the same initial values and computes the same outputs as built without it."""
    import contextlib

    import keras_nlp

    def model_fn():
        tf.keras.utils.set_random_seed(0)   # the unseeded initializers draw the same seeds
        return keras_nlp.models.BertBackbone(vocabulary_size=20, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=6)

    tokens = np.array([[2, 5, 7, 3, 0, 0], [2, 9, 3, 0, 0, 0]], np.int32)
    batch = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens),
             "padding_mask": (tokens > 0).astype(np.int32)}

    def build_and_run(scope):
        with tf.Graph().as_default() as graph, scope():
            model = model_fn()
            output = model({k: tf.constant(v) for k, v in batch.items()})["sequence_output"]
            with tf.compat.v1.Session(graph=graph) as session:
                session.run([v.initializer for v in model.variables])
                return session.run([v.read_value() for v in model.variables] + [output])

    with_scope = build_and_run(model_spec.graph_building)
    without = build_and_run(contextlib.nullcontext)
    assert len(with_scope) == len(without) > 10
    for got, want in zip(with_scope, without, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.large
def test_resume_on_other_frozen_weights_is_refused(tff_runtime, tmp_path):
    """A run's checkpoint holds only A and B; resuming it with a model whose frozen W0 differs
    (same shapes) raises `ResumeError` naming both fingerprints."""
    ids = ["c0", "c1", "c2"]

    def client_dataset_fn(cid, round_num):
        return _datasets([_CLIENTS[ids.index(cid)]])[0]

    def run(w0, rounds, resume):
        process = lora_fl.build_rolora(_lora_model(w0), _SPEC, _LR,
                                       loss_fn=tf.keras.losses.MeanSquaredError)
        return process, driver.run_rounds(
            process, participation.FullParticipation(ids), client_dataset_fn, rounds, tmp_path,
            driver.RunOptions(resume=resume, log=None))

    first, _ = run(_W0, 1, False)
    with pytest.raises(driver.ResumeError, match=rf"frozen weights {first.frozen_fingerprint}"
                                                      r", this model's are \w+"):
        run(_W0 + 1.0, 2, True)
    _, resumed = run(_W0, 2, True)   # the original frozen weights resume
    assert resumed.first_round == 2


def test_layout_assembles_the_whole_model():
    """`Layout.assemble` puts federated, base and personal values back at their positions."""
    spec = model_spec.inspect_model(_lora_model(), _SPEC)
    layout = frozen.Layout.from_spec(spec, trainable=(1,), personal=(0,))
    a, b, w0 = np.full((4, 2), 1.0), np.full((2, 3), 2.0), np.full((4, 3), 3.0)
    base = layout.base_values([a, b], [w0])
    assert [v.shape for v in base] == [(4, 2), (4, 3)]
    full = layout.assemble(tff.learning.models.ModelWeights([b + 1], []), base, [a + 5])
    np.testing.assert_array_equal(full.trainable[0], a + 5)
    np.testing.assert_array_equal(full.trainable[1], b + 1)
    np.testing.assert_array_equal(full.non_trainable[0], w0)
    with pytest.raises(ValueError, match="both federated and personal"):
        frozen.Layout.from_spec(spec, trainable=(0,), personal=(0,))



def test_a_missing_frozen_weights_file_is_a_clear_error(tmp_path):
    """The clients read the frozen weights from a file; if it disappears (a cleaned cache),
    asking the process for its next round names the file instead of failing in the worker."""
    import shutil

    process = lora_fl.build_ffa_lora(_lora_model(), _SPEC, _LR, frozen_dir=tmp_path,
                                     loss_fn=tf.keras.losses.MeanSquaredError)
    state = process.initialize()
    assert process.round_name(state) == "b_round"
    shutil.rmtree(tmp_path / process.frozen_fingerprint)
    with pytest.raises(FileNotFoundError, match=rf"{process.frozen_fingerprint}.*rebuild"):
        process.round_name(state)


@pytest.mark.parametrize("algorithm", tiered(["rolora", "flexlora"], fast=["rolora"]))
def test_xla_compiled_client_steps_give_the_same_rounds(tff_runtime, algorithm):
    """`jit_compile=True` marks each client step for XLA inside the client computation; the TFF
    worker runs it (uncompiled: its TensorFlow has no XLA, docs/PERFORMANCE.md) and two rounds
    equal the unmarked ones (float32 rounding)."""
    results = []
    for jit_compile in (False, True):
        process = lora_fl.build_lora_process(algorithm, _lora_model(), _SPEC, _LR,
                                             loss_fn=tf.keras.losses.MeanSquaredError,
                                             jit_compile=jit_compile)
        state = process.initialize()
        for _ in range(2):
            state = process.next_round(state, _datasets(_CLIENTS)).state
        results.append(process.model_weights(state).trainable)
    for plain, compiled in zip(*results, strict=True):
        np.testing.assert_allclose(compiled, plain, rtol=1e-5, atol=1e-6)
    assert np.abs(results[0][1]).max() > 0   # B trained
