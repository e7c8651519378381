"""tffl.algorithms.lora_fl: FLoRA (stacked products merged into the base kernel) against numpy.

The linear model and its numpy replica are `lora_linear`'s (see test_lora_fl).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models.lora_layers import LoraEinsumDense
from models.paper_models import RoloraMnistNetConfig, build_rolora_mnist_net
from tests.tffl.algorithms.lora_linear import (
    A0,
    BATCH,
    CLIENTS,
    COUNTS,
    D_IN,
    D_OUT,
    LR,
    RNG,
    W0,
    LinearLora,
    R,
    client_datasets,
    linear_model_fn,
    linear_spec,
    local_sgd,
    weighted_mean,
)
from tffl.algorithms import lora_fl
from tffl.engine import roles


def test_flora_merges_the_stacked_product_into_the_base_kernel(tff_runtime):
    """FLoRA on an `EinsumDense` kernel W0 (4, 2, 3) (d_in = 4, d_out = 6), LoRA rank 2, α = 1
    (scale 1/2), seed 7, three clients, weights p_i = n_i/Σn. After round t (numpy local SGD from
    the round's A and B = 0): W0 ← W0 + ½·reshape(Σ_i p_i A_i B_i, (4, 2, 3)), B = 0 and
    A = stateless_uniform((4, 2), seed [7, t], ±1/√4) (the documented fresh init, one adapter).
    Round 2 trains from that fresh A. Upload = the factors, r·(d_in + d_out) floats, + 16 bytes
    (three float32 metric sums and the float32 weight n_i); download = the federated weights
    A, B and the linked kernel W0, (4·2 + 2·6 + 4·2·3) floats."""
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=(4, 2, 3)).astype(np.float32)
    a0 = rng.normal(size=(4, 2)).astype(np.float32)
    scale, seed = 0.5, 7

    def model_fn():
        x = tf.keras.Input((4,))
        einsum = tf.keras.layers.EinsumDense("ab,bcd->acd", output_shape=(2, 3),
                                             kernel_initializer=tf.constant_initializer(w0))
        einsum.build((None, 4))
        lora = LoraEinsumDense(einsum, rank=2, alpha=1.0,
                               a_initializer=tf.constant_initializer(a0))
        return tf.keras.Model(x, lora(x))

    spec = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None, 2, 3], tf.float32))
    process = lora_fl.build_lora_process("flora", model_fn, spec, LR, seed=seed,
                                         loss_fn=tf.keras.losses.MeanSquaredError)
    factor_bytes = (4 * 2 + 2 * 6) * 4
    metric_sums, weight = 3 * 4, 4   # float32 loss sum, correct and example counts; float32 n_i
    assert lora_fl.METRIC_UPLOAD_BYTES == metric_sums + weight
    assert lora_fl.upload_bytes_per_communication_round(process) == {
        "ab_round": factor_bytes + metric_sums + weight}
    traffic = lora_fl.traffic_per_communication_round(process)["ab_round"]
    assert traffic.up == factor_bytes + metric_sums + weight
    assert traffic.down == (4 * 2 + 2 * 6 + 4 * 2 * 3) * 4
    # `traffic` is TFF's own sizing of the round (its MapReduceForm: FLoRA's
    # `federated_aggregate` has no DistributeAggregateForm); with no extra-role deltas no second
    # aggregator runs, so n_i travels once, with the factors; the declared figure agrees.
    assert process.next is process.rounds["ab_round"]   # the round `traffic` sized
    assert traffic == process.declared_traffic["ab_round"]

    clients = [(rng.normal(size=(n, 4)).astype(np.float32),
                rng.normal(size=(n, 2, 3)).astype(np.float32)) for n in (4, 6, 2)]
    counts = [n for n in (4, 6, 2)]
    datasets = [tf.data.Dataset.from_tensor_slices(c).batch(BATCH) for c in clients]
    state = process.initialize()
    kernel, a = w0.reshape(4, 6).astype(np.float64), a0
    for t in (1, 2):
        state = process.next_round(state, datasets).state
        (a_new, b_new), (kernel_new,) = process.get_model_weights(state)
        local = [local_sgd(a, np.zeros((2, 6)), kernel, x, y.reshape(-1, 6), LR, BATCH, "ab",
                            scale) for x, y in clients]
        kernel = kernel + scale * weighted_mean([ai @ bi for ai, bi in local], counts)
        np.testing.assert_allclose(kernel_new, kernel.reshape(4, 2, 3), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(b_new, np.zeros((2, 6)))
        a = tf.random.stateless_uniform((4, 2), seed=[seed, t], minval=-0.5, maxval=0.5).numpy()
        np.testing.assert_array_equal(a_new, a)
        assert process.round_num(state) == t


def test_flora_unweighted_two_adapters(tff_runtime):
    """FLoRA with `UnweightedMeanFactory` (p_i = 1/N) on two stacked linked layers of scale 2,
    from B = 0: W0_k ← W0_k + 2·(1/N)Σ_i A_{k,i}B_{k,i} for k = 1, 2 (numpy SGD through both
    layers), B_k = 0, fresh A_k from stream t·2 + k (t = 1). TFF's DAF cannot hold the
    `federated_aggregate`, so `tffl.engine.communication.round_traffic` reads the MapReduceForm (TFF
    cannot build a DistributeAggregateForm for it). The upload is the four factors + the metric
    sums + the float32 weight (ignored by the unweighted stacking, but part of the client's
    result); no deltas, so no second aggregator and no client count."""
    w1, w2 = W0[:, :3], RNG.normal(size=(3, 3)).astype(np.float32)
    a1, a2 = A0, RNG.normal(size=(3, 2)).astype(np.float32)
    process = lora_fl.build_flora(
        linear_model_fn([(w1, a1), (w2, a2)], scale=2.0, link=True), linear_spec(D_IN, 3), LR,
        loss_fn=tf.keras.losses.MeanSquaredError,
        aggregator=tff.aggregators.UnweightedMeanFactory())
    with pytest.raises(Exception):  # why the fallback exists; if TFF learns it, drop the fallback
        tff.backends.mapreduce.get_distribute_aggregate_form_for_computation(process.next)
    factor_bytes = (D_IN * 2 + 2 * 3 + 3 * 2 + 2 * 3) * 4
    metric_sums, weight = 3 * 4, 4
    upload = factor_bytes + metric_sums + weight
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": upload}
    traffic = lora_fl.traffic_per_communication_round(process)["ab_round"]
    assert traffic.up == upload
    assert traffic.down == (D_IN * 2 + 2 * 3 + 3 * 2 + 2 * 3 + D_IN * 3 + 3 * 3) * 4
    assert process.next is process.rounds["ab_round"]   # the round `traffic` sized
    output = process.next_round(process.initialize(), client_datasets(CLIENTS, BATCH))
    (new_a1, new_b1, new_a2, new_b2), (new_w1, new_w2) = process.get_model_weights(output.state)

    products = [[], []]
    for x, y in CLIENTS:   # one client's joint SGD on (A1, B1, A2, B2), numpy, float64
        f = [m.astype(np.float64) for m in (a1, np.zeros((2, 3)), a2, np.zeros((2, 3)))]
        for s in range(0, len(x), BATCH):
            xb, yb = x[s:s + BATCH].astype(np.float64), y[s:s + BATCH].astype(np.float64)
            h = xb @ w1 + 2.0 * xb @ f[0] @ f[1]
            g = 2.0 / yb.size * (h @ w2 + 2.0 * h @ f[2] @ f[3] - yb)
            gh = g @ (w2 + 2.0 * f[2] @ f[3]).T
            grads = [2.0 * xb.T @ gh @ f[1].T, 2.0 * (xb @ f[0]).T @ gh,
                     2.0 * h.T @ g @ f[3].T, 2.0 * (h @ f[2]).T @ g]
            f = [v - LR * gv for v, gv in zip(f, grads)]
        products[0].append(f[0] @ f[1])
        products[1].append(f[2] @ f[3])
    np.testing.assert_allclose(new_w1, w1 + 2.0 * np.mean(products[0], axis=0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(new_w2, w2 + 2.0 * np.mean(products[1], axis=0), rtol=1e-5,
                               atol=1e-5)
    for k, (a, b, d_in) in enumerate([(new_a1, new_b1, D_IN), (new_a2, new_b2, 3)]):
        bound = 1.0 / np.sqrt(d_in)
        np.testing.assert_array_equal(a, tf.random.stateless_uniform(
            (d_in, 2), seed=[0, 1 * 2 + k], minval=-bound, maxval=bound).numpy())
        np.testing.assert_array_equal(b, np.zeros((2, 3)))


def test_flora_with_a_head(tff_runtime):
    """FLoRA with a trained `head` (extra role): ŷ = (x·W0 + ½·x·A·B)·H + c, MSE, weighted mean.
    The head is aggregated as deltas by the aggregator (H ← Σ p_i H_i, c ← Σ p_i c_i) while the
    factors are stacked into W0 (numpy backprop). Upload = A, B, H, c + 16 bytes."""
    h0 = RNG.normal(size=(D_OUT, 2)).astype(np.float32)
    c0 = RNG.normal(size=2).astype(np.float32)

    def model_fn():
        x = tf.keras.Input((D_IN,))
        head = tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(h0),
                                     bias_initializer=tf.constant_initializer(c0))
        y = head(LinearLora(W0, A0, scale=0.5, link=True, name="lora")(x))
        roles.tag_layer(head, roles.HEAD)
        return tf.keras.Model(x, y)

    process = lora_fl.build_flora(model_fn, linear_spec(D_IN, 2), LR,
                                  loss_fn=tf.keras.losses.MeanSquaredError)
    upload = (D_IN * R + R * D_OUT + D_OUT * 2 + 2) * 4 + 3 * 4 + 4   # + sums, n_i
    assert process.declared_traffic["ab_round"].up == upload
    # TFF's sizing: the head's `MeanFactory` carries its own copy of n_i (4 more bytes).
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": upload + 4}
    # TFF's MapReduceForm: n_i once more (the stacking aggregate and the head's mean each sum it).
    assert process.next is process.rounds["ab_round"]   # the round `traffic` sized
    clients = [(x, RNG.normal(size=(len(x), 2)).astype(np.float32)) for x, _ in CLIENTS]
    output = process.next_round(process.initialize(), client_datasets(clients, BATCH))
    (_, b_new, h_new, c_new), (w_new,) = process.get_model_weights(output.state)

    products, heads, biases = [], [], []
    for x, y in clients:
        a, b, h, c = (m.astype(np.float64) for m in (A0, np.zeros((R, D_OUT)), h0, c0))
        for s in range(0, len(x), BATCH):
            xb, yb = x[s:s + BATCH].astype(np.float64), y[s:s + BATCH].astype(np.float64)
            z = xb @ W0 + 0.5 * xb @ a @ b
            g = 2.0 / yb.size * (z @ h + c - yb)
            gz = g @ h.T
            a, b, h, c = (a - LR * 0.5 * xb.T @ gz @ b.T, b - LR * 0.5 * (xb @ a).T @ gz,
                          h - LR * z.T @ g, c - LR * g.sum(0))
        products.append(a @ b)
        heads.append(h)
        biases.append(c)
    np.testing.assert_allclose(w_new, W0 + 0.5 * weighted_mean(products, COUNTS), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(h_new, weighted_mean(heads, COUNTS), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_new, weighted_mean(biases, COUNTS), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b_new, np.zeros((R, D_OUT)))


def test_flora_trains_the_relu_toy_net_through_its_base_kernel(tff_runtime):
    """FLoRA on RoLoRA's ReLU toy net with a linked zero W0 (`base_kernel=True`) and an initial
    B ≠ 0 (`b_stddev`): round 1 merges A·B into W0; round 2 starts from B = 0, where
    ReLU(x·W0) ≠ 0 still gives ∇B ≠ 0, so W0 moves again (with W0 = 0 nothing ever would)."""
    def model_fn():
        return build_rolora_mnist_net(RoloraMnistNetConfig(
            input_dim=12, rank=3, num_classes=4, a_stddev=0.5, b_stddev=0.1, base_kernel=True))

    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_flora(model_fn, spec, client_optimizer=0.5)
    rng = np.random.default_rng(0)
    datasets = [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(8, 12)).astype(np.float32), rng.integers(0, 4, size=8).astype(np.int32))
    ).batch(4) for _ in range(3)]
    state = process.initialize()
    kernels = [process.get_model_weights(state).non_trainable[0]]
    for _ in range(2):
        state = process.next_round(state, datasets).state
        weights = process.get_model_weights(state)
        np.testing.assert_array_equal(weights.trainable[1], np.zeros((3, 12)))
        kernels.append(weights.non_trainable[0])
    assert not kernels[0].any()
    assert np.abs(kernels[1] - kernels[0]).max() > 1e-4
    assert np.abs(kernels[2] - kernels[1]).max() > 1e-4


def test_flora_needs_linked_adapters():
    with pytest.raises(ValueError, match="link_lora.*unlinked: lora_0/lora_a"):
        lora_fl.build_flora(linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), 0.1)
