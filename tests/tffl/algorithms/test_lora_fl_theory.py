"""tffl.algorithms.lora_fl: the linear theory of RoLoRA (rolora.md §2) and the bytes per round.

The linear model is `lora_linear`'s (see test_lora_fl).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks.subspace import sin_theta
from tasks.synthetic import rolora_linear
from tests.tffl.algorithms.lora_linear import (
    client_datasets,
    linear_model_fn,
    linear_spec,
    row_mse,
    two_layer,
)
from tffl.algorithms import lora_fl


@pytest.mark.large  # the fast tier checks exact bytes through train.py (test_train_runs.py)
@pytest.mark.parametrize("dims", [(8, 8, 8), (6, 5, 3)])
def test_upload_per_communication_round(dims):
    """Per adapted matrix: B round r·d_out·4 bytes, A round r·d_in·4, FedAvg-LoRA r·(d_in+d_out)·4;
    plus METRIC_UPLOAD_BYTES = 16 (float32 loss sum, correct and example counts, and the float32
    weight n_i of the aggregation). Download: the federated weights (FFA-LoRA: B only). TFF's own
    DAF sizing of each round kind's computation agrees for the (default) weighted mean. With a
    plain `SumFactory` the declared figure still counts n_i, but TFF's DAF drops it (the sum never
    reads it); with `UnweightedMeanFactory` TFF uploads an int32 client count instead of n_i.
    Square matrices: RoLoRA and FFA-LoRA upload half of FedAvg-LoRA."""
    d_in, d_hidden, d_out = dims
    r = 2
    layers = two_layer(d_in, d_hidden, d_out, r)
    matrices = [(d_in, d_hidden), (d_hidden, d_out)]
    spec = linear_spec(d_in, d_out)
    metric_sums, weight, client_count = 3 * 4, 4, 4
    metric = metric_sums + weight
    assert lora_fl.METRIC_UPLOAD_BYTES == metric == 16
    b_bytes = sum(r * o * 4 for _, o in matrices)
    a_bytes = sum(r * i * 4 for i, _ in matrices)
    up, down = {}, {}
    for name in ("fedavg_lora", "ffa_lora", "rolora"):
        process = lora_fl.build_lora_process(name, linear_model_fn(layers), spec, 0.1,
                                             loss_fn=tf.keras.losses.MeanSquaredError)
        up[name] = lora_fl.upload_bytes_per_communication_round(process)
        traffic = lora_fl.traffic_per_communication_round(process)
        down[name] = {k: t.down for k, t in traffic.items()}
        assert {k: t.up for k, t in traffic.items()} == up[name]
        assert list(process.rounds) == list(traffic)   # each kind sized by TFF's own DAF
    assert up["fedavg_lora"] == {"ab_round": a_bytes + b_bytes + metric}
    assert up["ffa_lora"] == {"b_round": b_bytes + metric}
    assert up["rolora"] == {"b_round": b_bytes + metric, "a_round": a_bytes + metric}
    assert down["fedavg_lora"] == {"ab_round": a_bytes + b_bytes}
    assert down["ffa_lora"] == {"b_round": b_bytes}
    assert down["rolora"] == {"b_round": a_bytes + b_bytes, "a_round": a_bytes + b_bytes}
    # RoLoRA→FFA: one switch round kind; a client uploads the chosen factor's deltas packed
    # into max(|A|, |B|) floats, and gets the round number (int32) beside the weights.
    switching = lora_fl.build_rolora_then_ffa(0.5, 4, linear_model_fn(layers), spec, 0.1,
                                              loss_fn=tf.keras.losses.MeanSquaredError)
    traffic = lora_fl.traffic_per_communication_round(switching)
    assert {k: (t.down, t.up) for k, t in traffic.items()} == {
        "b_or_a_round": (a_bytes + b_bytes + 4, max(a_bytes, b_bytes) + metric)}
    assert switching.next is switching.rounds["b_or_a_round"]   # the round `traffic` sized
    if d_in == d_hidden == d_out:
        assert traffic["b_or_a_round"].up == up["rolora"]["a_round"] == up["rolora"]["b_round"]
        half = (up["fedavg_lora"]["ab_round"] - metric) / 2
        assert up["ffa_lora"]["b_round"] - metric == half
        assert up["rolora"]["b_round"] - metric == half == up["rolora"]["a_round"] - metric

    # Other aggregators: `traffic` is TFF's sizing of what they really move; the declared
    # figure (from the client work's result type) keeps counting n_i.
    summed = lora_fl.build_rolora(linear_model_fn(layers), spec, 0.1,
                                  aggregator=tff.aggregators.SumFactory(),
                                  loss_fn=tf.keras.losses.MeanSquaredError)
    assert {k: t.up for k, t in summed.declared_traffic.items()} == up["rolora"]
    assert lora_fl.upload_bytes_per_communication_round(summed) == {
        "b_round": b_bytes + metric_sums, "a_round": a_bytes + metric_sums}
    unweighted = lora_fl.build_rolora(linear_model_fn(layers), spec, 0.1,
                                      aggregator=tff.aggregators.UnweightedMeanFactory(),
                                      loss_fn=tf.keras.losses.MeanSquaredError)
    assert lora_fl.upload_bytes_per_communication_round(unweighted) == {
        "b_round": b_bytes + metric_sums + client_count,
        "a_round": a_bytes + metric_sums + client_count}


def test_linear_theory_rolora_recovers_a_star_ffa_does_not(tff_runtime):
    """rolora.md §2.1: Y_i = X_i a* b*ᵀ (homogeneous, noiseless; N=4, m=40, d=10), f = X a bᵀ with a
    frozen zero base. RoLoRA (10 local GD steps per round, η = 0.1) drives sin θ(a, a*) below 1e-3
    within 22 communication rounds (22 `next` calls, B and A alternating; it is ~5e-4 after 20);
    FFA-LoRA's a never moves (15 `next` calls, as before), so its sin θ stays at sin θ(a⁰, a*)."""
    n, m, d = 4, 40, 10
    problem = rolora_linear(num_clients=n, num_samples=m, dim=d, seed=0)
    rng = np.random.default_rng(1)
    a0 = rng.normal(size=(d, 1))
    a0 /= np.linalg.norm(a0)
    initial = sin_theta(a0, problem.a_star)
    assert initial > 0.5
    layers = [(np.zeros((d, d)), a0)]
    clients = [(problem.features[i].astype(np.float32), problem.targets[i].astype(np.float32))
               for i in range(n)]
    datasets = [ds.repeat(10) for ds in client_datasets(clients, m)]   # 10 full-batch local steps
    processes = {name: lora_fl.build_lora_process(name, linear_model_fn(layers), linear_spec(d, d),
                                                  0.1, loss_fn=row_mse)
                 for name in ("rolora", "ffa_lora")}
    angles = {}
    calls = {"rolora": 22, "ffa_lora": 15}   # communication rounds, one per `next`
    for name, process in processes.items():
        state = process.initialize()
        history = []
        for _ in range(calls[name]):
            state = process.next_round(state, datasets).state
            history.append(sin_theta(process.model_weights(state).trainable[0],
                                     problem.a_star))
        assert process.round_num(state) == calls[name]
        angles[name] = history
    print("sin theta per next call:", {k: [f"{a:.2g}" for a in v] for k, v in angles.items()})
    assert len(angles["rolora"]) == 22
    assert angles["rolora"][-1] < 1e-3, angles["rolora"]
    np.testing.assert_allclose(angles["ffa_lora"], initial, atol=1e-6)


@pytest.mark.large
def test_linear_theory_heterogeneous_clients(tff_runtime):
    """rolora.md §2.2: Y_i = X_i a* b_i*ᵀ with client-specific b_i* (γ = 1, ‖b̄*‖ = 1; N = 4,
    d = 8). The population minimizer still has a = a* (Lemma A3.15), so RoLoRA's sin θ(a, a*)
    ends ≥ 10× below FFA-LoRA's (which stays at sin θ(a⁰, a*), Prop. A3.17). With m samples per
    client the empirical optimum differs from a* by sampling error, so RoLoRA's final angle is
    smaller with m = 200 than with m = 20."""
    n, d, gamma = 4, 8, 1.0
    rng = np.random.default_rng(2)
    a0 = rng.normal(size=(d, 1))
    a0 /= np.linalg.norm(a0)
    processes = {name: lora_fl.build_lora_process(name, linear_model_fn([(np.zeros((d, d)), a0)]),
                                                  linear_spec(d, d), 0.1, loss_fn=row_mse)
                 for name in ("rolora", "ffa_lora")}
    final = {}
    # Communication rounds (one per `next`): RoLoRA 24 (12 B and 12 A rounds), FFA-LoRA 2.
    for name, m, nexts in (("rolora", 20, 24), ("rolora", 200, 24), ("ffa_lora", 200, 2)):
        problem = rolora_linear(num_clients=n, num_samples=m, dim=d, heterogeneity=gamma, seed=4)
        clients = [(problem.features[i].astype(np.float32),
                    problem.targets[i].astype(np.float32)) for i in range(n)]
        datasets = [ds.repeat(10) for ds in client_datasets(clients, m)]   # 10 full-batch GD steps
        process = processes[name]
        state = process.initialize()
        for _ in range(nexts):
            state = process.next_round(state, datasets).state
        assert process.round_num(state) == nexts
        final[name, m] = sin_theta(process.model_weights(state).trainable[0],
                                   problem.a_star)
        initial = sin_theta(a0, problem.a_star)   # a* depends on the seed only, not on m
    print("final sin theta:", final, "initial:", initial)
    assert initial > 0.5
    np.testing.assert_allclose(final["ffa_lora", 200], initial, atol=1e-6)
    assert final["rolora", 200] < final["ffa_lora", 200] / 10
    assert final["rolora", 20] < final["ffa_lora", 200] / 10
    assert final["rolora", 200] < final["rolora", 20] / 2
