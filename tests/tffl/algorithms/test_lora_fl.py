"""tffl.algorithms.lora_fl: federated LoRA processes checked against independent numpy computations.

The test model is linear, y = x·W0 + x·A·B (W0 frozen, A `lora_a`, B `lora_b`), with the Keras
MSE loss ℓ = (1/(n·d_out)) Σ (ŷ − y)² per batch, whose gradients numpy computes by hand:
G = (2/(n·d_out))·(ŷ − y), ∇_B ℓ = (x·A)ᵀ·G, ∇_A ℓ = xᵀ·G·Bᵀ.

The builders live in `lora_linear`; FLoRA, FlexLoRA and the linear theory and upload sizes have
modules of their own.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.simulation import checkpoint
from tffl.algorithms import lora_fl
from tffl.simulation import participation
from tffl.engine import roles
from tffl.simulation import driver
from tffl.simulation import metrics_log
from tests.tiers import tiered


from tests.tffl.algorithms.lora_linear import (
    linear_model_fn, linear_spec, client_datasets, local_sgd, weighted_mean, D_IN, D_OUT, R,
    W0, A0, B0, CLIENTS, COUNTS, LR, BATCH, small_process, start, run, lora_with_head,
)


def test_rolora_rounds_are_exact(tff_runtime):
    """B round: B̄ = Σ n_i B_i/Σ n_i, and A0·B̄ = mean_i(A0·B_i); A round from (A0, B̄):
    Ā = mean_i A_i and Ā·B̄ = mean_i(A_i·B̄); both against numpy local SGD. Each `next` is one
    communication round (B, then A), both on the same client data."""
    process = small_process("rolora")
    state = start(process)
    assert process.round_num(state) == 0 and process.round_name(state) == "b_round"
    datasets = client_datasets(CLIENTS, BATCH)
    state, (b_metrics,) = run(process, state, datasets, 1)
    a_mid, b_mid = process.model_weights(state).trainable
    assert process.round_num(state) == 1 and process.round_name(state) == "a_round"
    state, (a_metrics,) = run(process, state, datasets, 1)
    a_new, b_new = process.model_weights(state).trainable
    np.testing.assert_array_equal(a_mid, A0)     # the B round leaves A alone
    np.testing.assert_array_equal(b_new, b_mid)   # the A round leaves B alone
    output_metrics = {**b_metrics, **a_metrics}

    b_locals = [local_sgd(A0, B0, W0, x, y, LR, BATCH, "b")[1] for x, y in CLIENTS]
    b_bar = weighted_mean(b_locals, COUNTS)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(A0 @ b_new, weighted_mean([A0 @ b for b in b_locals], COUNTS),
                               rtol=1e-5, atol=1e-5)

    a_locals = [local_sgd(A0, b_bar, W0, x, y, LR, BATCH, "a")[0] for x, y in CLIENTS]
    np.testing.assert_allclose(a_new, weighted_mean(a_locals, COUNTS), rtol=1e-5, atol=1e-5)
    mean_product = weighted_mean([a @ b_bar for a in a_locals], COUNTS)
    np.testing.assert_allclose(a_new @ b_new, mean_product, rtol=1e-4, atol=1e-5)
    assert process.round_num(state) == 2
    assert set(b_metrics) == {"b_round"} and set(a_metrics) == {"a_round"}
    assert set(output_metrics) == {"b_round", "a_round"}
    for name in ("b_round", "a_round"):
        assert output_metrics[name]["client_work"]["train"]["num_examples"] == sum(COUNTS)
    # The B-round loss is the example-weighted loss before each local step, from numpy:
    loss_sum = 0.0
    for x, y in CLIENTS:
        b = B0.astype(np.float64)
        for s in range(0, len(x), BATCH):
            xb, yb = x[s:s + BATCH], y[s:s + BATCH]
            loss_sum += len(xb) * np.mean((xb @ W0 + xb @ A0 @ b - yb) ** 2)
            b = local_sgd(A0, b, W0, xb, yb, LR, BATCH, "b")[1]
    np.testing.assert_allclose(output_metrics["b_round"]["client_work"]["train"]["loss"],
                               loss_sum / sum(COUNTS), rtol=1e-5)


def test_fedavg_lora_averages_factors_and_shows_the_gap(tff_runtime):
    """FedAvg-LoRA: A ← mean A_i, B ← mean B_i (numpy), and mean_i(A_iB_i) ≠ Ā·B̄ visibly."""
    process = small_process("fedavg_lora")
    output = process.next_round(start(process), client_datasets(CLIENTS, BATCH))
    a_new, b_new = process.get_model_weights(output.state).trainable   # A and B both travel
    for whole, federated in zip(process.model_weights(output.state).trainable, (a_new, b_new)):
        np.testing.assert_array_equal(whole, federated)

    local = [local_sgd(A0, B0, W0, x, y, LR, BATCH, "ab") for x, y in CLIENTS]
    a_bar = weighted_mean([a for a, _ in local], COUNTS)
    b_bar = weighted_mean([b for _, b in local], COUNTS)
    np.testing.assert_allclose(a_new, a_bar, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-5)
    mean_product = weighted_mean([a @ b for a, b in local], COUNTS)
    gap = np.linalg.norm(mean_product - a_new @ b_new) / np.linalg.norm(mean_product)
    print(f"FedAvg-LoRA relative gap {gap:.3g}")
    assert gap > 1e-2, gap   # the aggregation "interference" RoLoRA removes
    assert process.round_num(output.state) == 1
    assert output.metrics["client_work"]["train"]["num_examples"] == sum(COUNTS)   # unkeyed


def test_ffa_lora_keeps_a_and_averages_b(tff_runtime):
    process = small_process("ffa_lora")
    output = process.next_round(start(process), client_datasets(CLIENTS, BATCH))
    a_new, b_new = process.model_weights(output.state).trainable
    (federated_b,) = process.get_model_weights(output.state).trainable   # A never travels
    np.testing.assert_array_equal(federated_b, b_new)
    np.testing.assert_array_equal(a_new, A0)
    b_locals = [local_sgd(A0, B0, W0, x, y, LR, BATCH, "b")[1] for x, y in CLIENTS]
    np.testing.assert_allclose(b_new, weighted_mean(b_locals, COUNTS), rtol=1e-5, atol=1e-6)


def test_fedavg_lora_averaging_error_against_numpy(tff_runtime, tmp_path):
    """`averaging_error=True` (two clients of 4 and 6 examples, weights p_i = n_i/Σn, two rounds
    through `tffl.simulation.driver.run_rounds`): metrics.csv's `finalizer/averaging_error` is
    ‖Ā·B̄ − Σp_iA_iB_i‖_F / ‖Σp_iA_iB_i − A·B‖_F with numpy SGD's client factors from the round's
    (A, B); the bytes per client, the declared traffic and the states equal plain FedAvg-LoRA's."""
    clients = CLIENTS[:2]
    counts = COUNTS[:2]
    measured = small_process("fedavg_lora", averaging_error=True)
    plain = small_process("fedavg_lora")
    assert measured.traffic == plain.traffic
    assert measured.declared_traffic == plain.declared_traffic
    datasets = client_datasets(clients, BATCH)
    ids = ["c0", "c1"]
    result = driver.run_rounds(
        measured, participation.FullParticipation(ids), lambda cid, t: datasets[ids.index(cid)], 2,
        tmp_path,
        driver.RunOptions(log=None, tensorboard=False, initial_state=start(measured)))
    rows = metrics_log.read_metrics(tmp_path / driver.METRICS_FILE)
    state = start(plain)
    for row in rows:
        state = plain.next(state, datasets).state
        assert row["bytes_up_per_client"] == plain.traffic["ab_round"].up
    for x, y in zip(measured.get_model_weights(result.state).trainable,
                    plain.get_model_weights(state).trainable):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)

    a, b = A0.astype(np.float64), B0.astype(np.float64)
    p = np.asarray(counts, np.float64) / sum(counts)
    for row in rows:
        local = [local_sgd(a, b, W0, x, y, LR, BATCH, "ab") for x, y in clients]
        a_bar = sum(pi * ai for pi, (ai, _) in zip(p, local))
        b_bar = sum(pi * bi for pi, (_, bi) in zip(p, local))
        mean_product = sum(pi * ai @ bi for pi, (ai, bi) in zip(p, local))
        error = (np.linalg.norm(a_bar @ b_bar - mean_product)
                 / np.linalg.norm(mean_product - a @ b))
        assert error > 1e-3, error
        np.testing.assert_allclose(row["finalizer/averaging_error"], error, rtol=1e-5)
        a, b = a_bar, b_bar
    with pytest.raises(ValueError, match="averaging_error is FedAvg-LoRA's.*'rolora'"):
        small_process("rolora", averaging_error=True)


def test_weights_of_another_rank_are_rejected(tff_runtime, tmp_path):
    """A rank-2 model's weights cannot be set into, nor a rank-2 checkpoint loaded into, a rank-4
    process: `set_model_weights` raises one ValueError naming the variable and both shapes;
    `tffl.simulation.checkpoint.load` raises `CheckpointMismatchError` naming both shapes."""
    rank2 = small_process("rolora")
    a4 = np.random.default_rng(5).normal(size=(D_IN, 4)).astype(np.float32)
    rank4 = lora_fl.build_rolora(linear_model_fn([(W0, a4)]), linear_spec(D_IN, D_OUT), LR,
                                 loss_fn=tf.keras.losses.MeanSquaredError)
    state2, state4 = rank2.initialize(), rank4.initialize()
    with pytest.raises(ValueError, match=r"lora_0/lora_a.*role lora_a.* shape \(4, 4\) in this "
                                         r"process's model, got a value of shape \(4, 2\)"):
        rank4.set_model_weights(state4, rank2.get_model_weights(state2))
    path = checkpoint.save(tmp_path, round_num=1, state=state2)
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=r"shape \(4, 2\), this process expects \(4, 4\)"):
        checkpoint.load(path, template=state4)
    loaded, _, _ = checkpoint.load(path, template=state2)   # the matching template loads
    np.testing.assert_array_equal(rank2.get_model_weights(loaded).trainable[0], A0)


@pytest.mark.large
def test_differentially_private_aggregator_composes_with_rolora(tff_runtime):
    """With noise 0, `gaussian_fixed` is the mean over `clients_per_round` of the clipped deltas,
    clip(Δ) = Δ·min(1, c/‖Δ‖): checked per round against numpy. With noise > 0 a round runs and
    gives finite weights. Two `next` calls (a B round, then an A round) on the same data."""
    clip = 0.05
    dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.0, clients_per_round=len(CLIENTS), clip=clip)
    process = small_process("rolora", aggregator=dp)
    state, metrics = run(process, start(process), client_datasets(CLIENTS, BATCH), 2)
    assert [sorted(m) for m in metrics] == [["b_round"], ["a_round"]]
    a_new, b_new = process.model_weights(state).trainable

    def clipped_mean(deltas):
        return sum(dl * min(1.0, clip / np.linalg.norm(dl)) for dl in deltas) / len(deltas)

    b_deltas = [local_sgd(A0, B0, W0, x, y, LR, BATCH, "b")[1] - B0 for x, y in CLIENTS]
    assert min(np.linalg.norm(dl) for dl in b_deltas) > clip   # clipping really acts
    b_bar = B0 + clipped_mean(b_deltas)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-6)
    a_deltas = [local_sgd(A0, b_bar, W0, x, y, LR, BATCH, "a")[0] - A0 for x, y in CLIENTS]
    np.testing.assert_allclose(a_new, A0 + clipped_mean(a_deltas), rtol=1e-5, atol=1e-6)

    noisy = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=1.0, clients_per_round=len(CLIENTS), clip=clip)
    process = small_process("rolora", aggregator=noisy)
    state, _ = run(process, start(process), client_datasets(CLIENTS, BATCH), 2)
    a_new, b_new = process.model_weights(state).trainable
    assert np.isfinite(a_new).all() and np.isfinite(b_new).all()
    assert not np.allclose(b_new, b_bar)


def test_rolora_then_ffa_schedule(tff_runtime):
    """4 communication rounds, first half RoLoRA: a B round and an A round (A moves), then two
    B-only rounds in which A stays fixed. `next` is one `tff.Computation` (one switch round kind,
    `tffl.engine.switch_round`): the client work's state counts the rounds and chooses B or A in-graph,
    and the finalizer reports the kind that ran."""
    process = lora_fl.build_rolora_then_ffa(
        0.5, 4, linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), LR,
        loss_fn=tf.keras.losses.MeanSquaredError)
    assert isinstance(process.next, tff.Computation)
    state = process.initialize()
    seen = []
    for _ in range(4):
        name = process.round_name(state)
        state, metrics = process.next(state, client_datasets(CLIENTS, BATCH))
        a, b = process.model_weights(state).trainable
        kind = metrics["finalizer"]["round_kind"]
        seen.append((process.round_num(state), name, kind.decode(), a, b))
    assert [s[:3] for s in seen] == [(1, "b_or_a_round", "b_round"), (2, "b_or_a_round", "a_round"),
                                     (3, "b_or_a_round", "b_round"), (4, "b_or_a_round", "b_round")]
    np.testing.assert_array_equal(seen[0][3], A0)       # the B round keeps A
    assert not np.allclose(seen[1][3], A0)              # the A round moves it
    np.testing.assert_array_equal(seen[1][4], seen[0][4])   # ... and keeps B
    np.testing.assert_array_equal(seen[2][3], seen[1][3])   # B-only rounds: A stays fixed
    np.testing.assert_array_equal(seen[3][3], seen[1][3])
    assert not np.allclose(seen[2][4], seen[1][4])       # while B trains
    assert not np.allclose(seen[3][4], seen[2][4])
    # Every round, the post-switch FFA rounds included, against the float64 numpy replica:
    # client i trains the round's factor from the broadcast (A, B); the server takes the
    # example-weighted mean of the trained factor; the other factor is unchanged.
    a, b = A0.astype(np.float64), np.zeros((R, D_OUT))
    for t, factor in enumerate(("b", "a", "b", "b")):
        local = [local_sgd(a, b, W0, x, y, LR, BATCH, train=factor) for x, y in CLIENTS]
        if factor == "a":
            a = weighted_mean([ai for ai, _ in local], COUNTS)
        else:
            b = weighted_mean([bi for _, bi in local], COUNTS)
        np.testing.assert_allclose(seen[t][3], a, rtol=2e-5, atol=1e-6, err_msg=f"A, round {t + 1}")
        np.testing.assert_allclose(seen[t][4], b, rtol=2e-5, atol=1e-6, err_msg=f"B, round {t + 1}")


def test_rolora_with_a_head_runs_in_the_simulation_loop(tff_runtime, tmp_path):
    """RoLoRA on a classifier whose head (role `head`) is trained and uploaded in both rounds,
    driven by `tffl.simulation.driver.run_rounds` (metrics, checkpoints, resume): one row per
    communication round (B, A, B, A, ...), and the state's `round_num` counts them."""
    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_rolora(lora_with_head, spec, client_optimizer=0.5)
    head_bytes = (6 * 3 + 3) * 4
    metric_bytes = 3 * 4 + 4   # three float32 metric sums and the float32 weight n_i
    up = {"b_round": 2 * 6 * 4 + head_bytes + metric_bytes,
          "a_round": 12 * 2 * 4 + head_bytes + metric_bytes}
    assert lora_fl.upload_bytes_per_communication_round(process) == up
    down = (12 * 2 + 2 * 6) * 4 + head_bytes   # A, B and the head, in both rounds
    rng = np.random.default_rng(0)
    data = {f"c{i}": (rng.normal(size=(8, 12)).astype(np.float32),
                      rng.integers(0, 3, size=8).astype(np.int32)) for i in range(3)}

    def client_dataset_fn(client_id, round_num):
        return tf.data.Dataset.from_tensor_slices(data[client_id]).batch(4)

    sampler = participation.FullParticipation(sorted(data))
    first = driver.run_rounds(
        process, sampler, client_dataset_fn, 4, tmp_path, driver.RunOptions(log=None))
    assert process.round_num(first.state) == 4
    weights = process.get_model_weights(first.state).trainable
    for whole, federated in zip(process.model_weights(first.state).trainable, weights):
        np.testing.assert_array_equal(whole, federated)   # everything trainable travels
    initial = process.get_model_weights(process.initialize()).trainable
    assert [w.shape for w in weights] == [(12, 2), (2, 6), (6, 3), (3,)]
    for before, after in zip(initial, weights):
        assert not np.allclose(before, after)
    rows = first.history
    names = ["b_round", "a_round", "b_round", "a_round"]
    assert [row["round"] for row in rows] == [1, 2, 3, 4]
    assert [row["communication_rounds"] for row in rows] == [1, 2, 3, 4]
    assert [row["bytes_up_per_client"] for row in rows] == [up[n] for n in names]
    assert [row["bytes_down_per_client"] for row in rows] == [down] * 4
    for row, name in zip(rows, names):
        other = "a_round" if name == "b_round" else "b_round"
        assert not any(key.startswith(other + "/") for key in row)   # one round kind a row
        assert row[f"{name}/client_work/train/num_examples"] == 24.0
        assert row["train_loss"] == row[f"{name}/client_work/train/loss"]
    assert np.isfinite(rows[-1]["a_round/client_work/train/loss"])
    assert rows[-1]["train_loss"] == rows[-1]["a_round/client_work/train/loss"]   # the last round's
    assert rows[3]["a_round/client_work/train/loss"] < rows[0]["b_round/client_work/train/loss"]
    resumed = driver.run_rounds(
        process, sampler, client_dataset_fn, 6, tmp_path,
        driver.RunOptions(resume=True, log=None))
    assert resumed.first_round == 5 and process.round_num(resumed.state) == 6
    assert [row["communication_rounds"] for row in resumed.history] == [1, 2, 3, 4, 5, 6]


def _dense_only():
    x = tf.keras.Input((3,))
    return tf.keras.Model(x, tf.keras.layers.Dense(2)(x))


def test_model_without_lora_variables_is_rejected():
    with pytest.raises(ValueError, match="no trainable LoRA factors"):
        lora_fl.build_rolora(_dense_only, linear_spec(3, 2), 0.1)


def test_unknown_algorithm_and_bad_learning_rate():
    with pytest.raises(ValueError, match="unknown LoRA algorithm 'fedsgd'"):
        lora_fl.build_lora_process("fedsgd", linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT),
                                   0.1)
    with pytest.raises(ValueError, match="client_optimizer=0 must be a finite number > 0"):
        lora_fl.build_lora_process("rolora", linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT),
                                   0)
    with pytest.raises(ValueError, match="extra_roles may hold"):
        lora_fl.build_ffa_lora(linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), 0.1,
                               extra_roles=(roles.LORA_A,))
    with pytest.raises(ValueError, match="rolora_fraction=1.5"):
        lora_fl.build_rolora_then_ffa(1.5, 10, linear_model_fn([(W0, A0)]),
                                      linear_spec(D_IN, D_OUT), 0.1)


@pytest.mark.parametrize("name", tiered(["rolora", "flexlora"], fast=["rolora"]))
def test_client_work_is_pinned_to_the_given_device(tff_runtime, name):
    """`client_device` places every op of the client computations on that device (read off the
    serialized graphs); TFF's worker (CPU only) soft-places them, and the round is unchanged."""
    from tffl import production

    pinned = small_process(name, client_device="/device:CPU:1")
    plain = small_process(name)
    assert list(pinned.rounds) == list(plain.rounds) == (
        ["b_round", "a_round"] if name == "rolora" else ["ab_round"])
    for round_name in pinned.rounds:   # each round kind is a federated computation
        assert b"/device:CPU:1" in production.serialize(pinned.rounds[round_name])
        assert b"/device:CPU:1" not in production.serialize(plain.rounds[round_name])
    # One `next` per round kind (RoLoRA: a B and an A round) on the same data.
    state_pinned, _ = run(pinned, start(pinned), client_datasets(CLIENTS, BATCH),
                           len(pinned.rounds))
    state_plain, _ = run(plain, start(plain), client_datasets(CLIENTS, BATCH), len(plain.rounds))
    for x, y in zip(pinned.get_model_weights(state_pinned).trainable,
                    plain.get_model_weights(state_plain).trainable):
        np.testing.assert_allclose(x, y, rtol=1e-6)
