"""tffl.algorithms.lora_fl: federated LoRA processes checked against independent numpy computations.

The test model is linear, y = x·W0 + x·A·B (W0 frozen, A `lora_a`, B `lora_b`), with the Keras
MSE loss ℓ = (1/(n·d_out)) Σ (ŷ − y)² per batch, whose gradients numpy computes by hand:
G = (2/(n·d_out))·(ŷ − y), ∇_B ℓ = (x·A)ᵀ·G, ∇_A ℓ = xᵀ·G·Bᵀ.
"""


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks.subspace import sin_theta
from tasks.synthetic import rolora_linear
from models.lora_layers import LoraEinsumDense
from models.paper_models import LowRankDense, build_rolora_mnist_net
from tffl.simulation import checkpoint
from tffl.engine import communication
from tffl.algorithms import lora_fl
from tffl.simulation import participation
from tffl.engine import roles
from tffl.simulation import driver as simulation


class _LinearLora(tf.keras.layers.Layer):
    """y = x·W0 + x·A·B with W0 (d_in×d_out, frozen), A (d_in×r, lora_a), B (r×d_out, lora_b)."""

    def __init__(self, w0, a0, scale=1.0, link=False, **kwargs):
        super().__init__(**kwargs)
        self.w0, self.a0 = np.asarray(w0, np.float32), np.asarray(a0, np.float32)
        self.scale, self.link = scale, link

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=self.w0.shape, trainable=False,
                                      initializer=tf.constant_initializer(self.w0))
        self.lora_a = self.add_weight(name="lora_a", shape=self.a0.shape,
                                      initializer=tf.constant_initializer(self.a0))
        self.lora_b = self.add_weight(name="lora_b", shape=(self.a0.shape[1], self.w0.shape[1]),
                                      initializer="zeros")
        roles.tag(self.kernel, roles.FROZEN)
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)
        if self.link:
            roles.link_lora(self.lora_a, self.lora_b, self.kernel, self.scale)

    def call(self, x):
        return tf.matmul(x, self.kernel) + self.scale * tf.matmul(tf.matmul(x, self.lora_a),
                                                                  self.lora_b)


def _model_fn(layers, **kwargs):
    """Builder of a stack of `_LinearLora` layers given as [(w0, a0), ...]; `kwargs` go to each."""

    def build():
        x = tf.keras.Input((layers[0][0].shape[0],))
        y = x
        for k, (w0, a0) in enumerate(layers):
            y = _LinearLora(w0, a0, name=f"lora_{k}", **kwargs)(y)
        return tf.keras.Model(x, y)

    return build


def _spec(d_in, d_out):
    return (tf.TensorSpec([None, d_in], tf.float32), tf.TensorSpec([None, d_out], tf.float32))


def _datasets(clients, batch_size):
    return [tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size) for x, y in clients]


def _local_sgd(a, b, w0, x, y, lr, batch_size, train, scale=1.0):
    """Independent numpy replica of one client's pass: SGD on the factors named in `train`, for
    ŷ = x·W0 + scale·x·A·B."""
    a, b = a.astype(np.float64).copy(), b.astype(np.float64).copy()
    for s in range(0, len(x), batch_size):
        xb, yb = x[s:s + batch_size].astype(np.float64), y[s:s + batch_size].astype(np.float64)
        g = 2.0 / yb.size * (xb @ w0 + scale * xb @ a @ b - yb)
        grad_a, grad_b = scale * xb.T @ g @ b.T, scale * (xb @ a).T @ g
        if "a" in train:
            a = a - lr * grad_a
        if "b" in train:
            b = b - lr * grad_b
    return a, b


def _weighted_mean(values, counts):
    counts = np.asarray(counts, np.float64)
    return sum(c * v for c, v in zip(counts, values)) / counts.sum()


# A small problem shared by the exactness tests: d_in=4, d_out=3, r=2, three clients of unequal size
# (4, 6, 2 examples; batch 2, so 2, 3 and 1 local steps), weighted mean by examples.
_RNG = np.random.default_rng(0)
_D_IN, _D_OUT, _R = 4, 3, 2
_W0 = _RNG.normal(size=(_D_IN, _D_OUT)).astype(np.float32)
_A0 = _RNG.normal(size=(_D_IN, _R)).astype(np.float32)
_B0 = (0.5 * _RNG.normal(size=(_R, _D_OUT))).astype(np.float32)  # set as a non-zero start
_CLIENTS = [(_RNG.normal(size=(n, _D_IN)).astype(np.float32),
             _RNG.normal(size=(n, _D_OUT)).astype(np.float32)) for n in (4, 6, 2)]
_COUNTS = [len(x) for x, _ in _CLIENTS]
_LR, _BATCH = 0.1, 2


def _small_process(name, **kwargs):
    return lora_fl.build_lora_process(
        name, _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), _LR,
        loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


def _start(process, b0=_B0):
    """Initial state with B set to `b0` (tests `with_model_weights` and a non-zero B start)."""
    state = process.initialize()
    weights = process.model_weights(state)   # the whole model: [A, B] trainable, [W0] frozen
    np.testing.assert_array_equal(weights.trainable[0], _A0)
    np.testing.assert_array_equal(weights.trainable[1], np.zeros((_R, _D_OUT)))
    np.testing.assert_array_equal(weights.non_trainable[0], _W0)
    weights = tff.learning.models.ModelWeights(
        trainable=[weights.trainable[0], b0], non_trainable=weights.non_trainable)
    state = process.with_model_weights(state, weights)
    set_weights = process.model_weights(state)
    np.testing.assert_array_equal(set_weights.trainable[1], b0)
    np.testing.assert_array_equal(set_weights.trainable[0], _A0)
    np.testing.assert_array_equal(set_weights.non_trainable[0], _W0)
    return state


def _run(process, state, datasets, calls):
    """`calls` calls of `next` (one communication round each) on the same `datasets`; returns the
    last state and the list of each call's metrics."""
    metrics = []
    for _ in range(calls):
        state, round_metrics = process.next_round(state, datasets)
        metrics.append(round_metrics)
    return state, metrics


def test_rolora_rounds_are_exact(tff_runtime):
    """B round: B̄ = Σ n_i B_i/Σ n_i, and A0·B̄ = mean_i(A0·B_i); A round from (A0, B̄):
    Ā = mean_i A_i and Ā·B̄ = mean_i(A_i·B̄); both against numpy local SGD. Each `next` is one
    communication round (B, then A), both on the same client data."""
    process = _small_process("rolora")
    state = _start(process)
    assert process.round_num(state) == 0 and process.round_name(state) == "b_round"
    datasets = _datasets(_CLIENTS, _BATCH)
    state, (b_metrics,) = _run(process, state, datasets, 1)
    a_mid, b_mid = process.model_weights(state).trainable
    assert process.round_num(state) == 1 and process.round_name(state) == "a_round"
    state, (a_metrics,) = _run(process, state, datasets, 1)
    a_new, b_new = process.model_weights(state).trainable
    np.testing.assert_array_equal(a_mid, _A0)     # the B round leaves A alone
    np.testing.assert_array_equal(b_new, b_mid)   # the A round leaves B alone
    output_metrics = {**b_metrics, **a_metrics}

    b_locals = [_local_sgd(_A0, _B0, _W0, x, y, _LR, _BATCH, "b")[1] for x, y in _CLIENTS]
    b_bar = _weighted_mean(b_locals, _COUNTS)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_A0 @ b_new, _weighted_mean([_A0 @ b for b in b_locals], _COUNTS),
                               rtol=1e-5, atol=1e-5)

    a_locals = [_local_sgd(_A0, b_bar, _W0, x, y, _LR, _BATCH, "a")[0] for x, y in _CLIENTS]
    np.testing.assert_allclose(a_new, _weighted_mean(a_locals, _COUNTS), rtol=1e-5, atol=1e-5)
    mean_product = _weighted_mean([a @ b_bar for a in a_locals], _COUNTS)
    np.testing.assert_allclose(a_new @ b_new, mean_product, rtol=1e-4, atol=1e-5)
    assert process.round_num(state) == 2
    assert set(b_metrics) == {"b_round"} and set(a_metrics) == {"a_round"}
    assert set(output_metrics) == {"b_round", "a_round"}
    for name in ("b_round", "a_round"):
        assert output_metrics[name]["client_work"]["train"]["num_examples"] == sum(_COUNTS)
    # The B-round loss is the example-weighted loss before each local step, from numpy:
    loss_sum = 0.0
    for x, y in _CLIENTS:
        b = _B0.astype(np.float64)
        for s in range(0, len(x), _BATCH):
            xb, yb = x[s:s + _BATCH], y[s:s + _BATCH]
            loss_sum += len(xb) * np.mean((xb @ _W0 + xb @ _A0 @ b - yb) ** 2)
            b = _local_sgd(_A0, b, _W0, xb, yb, _LR, _BATCH, "b")[1]
    np.testing.assert_allclose(output_metrics["b_round"]["client_work"]["train"]["loss"],
                               loss_sum / sum(_COUNTS), rtol=1e-5)


def test_fedavg_lora_averages_factors_and_shows_the_gap(tff_runtime):
    """FedAvg-LoRA: A ← mean A_i, B ← mean B_i (numpy), and mean_i(A_iB_i) ≠ Ā·B̄ visibly."""
    process = _small_process("fedavg_lora")
    output = process.next_round(_start(process), _datasets(_CLIENTS, _BATCH))
    a_new, b_new = process.get_model_weights(output.state).trainable   # A and B both travel
    for whole, federated in zip(process.model_weights(output.state).trainable, (a_new, b_new)):
        np.testing.assert_array_equal(whole, federated)

    local = [_local_sgd(_A0, _B0, _W0, x, y, _LR, _BATCH, "ab") for x, y in _CLIENTS]
    a_bar = _weighted_mean([a for a, _ in local], _COUNTS)
    b_bar = _weighted_mean([b for _, b in local], _COUNTS)
    np.testing.assert_allclose(a_new, a_bar, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-5)
    mean_product = _weighted_mean([a @ b for a, b in local], _COUNTS)
    gap = np.linalg.norm(mean_product - a_new @ b_new) / np.linalg.norm(mean_product)
    print(f"FedAvg-LoRA relative gap {gap:.3g}")
    assert gap > 1e-2, gap   # the aggregation "interference" RoLoRA removes
    assert process.round_num(output.state) == 1
    assert output.metrics["client_work"]["train"]["num_examples"] == sum(_COUNTS)   # unkeyed


def test_ffa_lora_keeps_a_and_averages_b(tff_runtime):
    process = _small_process("ffa_lora")
    output = process.next_round(_start(process), _datasets(_CLIENTS, _BATCH))
    a_new, b_new = process.model_weights(output.state).trainable
    (federated_b,) = process.get_model_weights(output.state).trainable   # A never travels
    np.testing.assert_array_equal(federated_b, b_new)
    np.testing.assert_array_equal(a_new, _A0)
    b_locals = [_local_sgd(_A0, _B0, _W0, x, y, _LR, _BATCH, "b")[1] for x, y in _CLIENTS]
    np.testing.assert_allclose(b_new, _weighted_mean(b_locals, _COUNTS), rtol=1e-5, atol=1e-6)


def test_flexlora_is_truncated_svd_of_mean_product(tff_runtime):
    """FlexLoRA with r=1 < rank of mean_i(A_iB_i): A·B = best rank-1 approximation (numpy SVD),
    A = U_1·√s_1 and B = √s_1·V_1ᵀ so AᵀA = B·Bᵀ = s_1."""
    a0 = _A0[:, :1]
    process = lora_fl.build_flexlora(_model_fn([(_W0, a0)]), _spec(_D_IN, _D_OUT), _LR,
                                     loss_fn=tf.keras.losses.MeanSquaredError)
    b0 = _B0[:1]
    state = process.initialize()
    weights = process.get_model_weights(state)
    state = process.set_model_weights(state, tff.learning.models.ModelWeights(
        trainable=[weights.trainable[0], b0], non_trainable=weights.non_trainable))
    output = process.next_round(state, _datasets(_CLIENTS, _BATCH))
    a_new, b_new = process.get_model_weights(output.state).trainable

    local = [_local_sgd(a0, b0, _W0, x, y, _LR, _BATCH, "ab") for x, y in _CLIENTS]
    u, s, vt = np.linalg.svd(_weighted_mean([a @ b for a, b in local], _COUNTS))
    assert s[1] > 1e-3 * s[0]   # the mean product really has rank > 1
    np.testing.assert_allclose(a_new @ b_new, s[0] * np.outer(u[:, 0], vt[0]), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(a_new.T @ a_new, [[s[0]]], rtol=1e-4)
    np.testing.assert_allclose(b_new @ b_new.T, [[s[0]]], rtol=1e-4)


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
    process = lora_fl.build_lora_process("flora", model_fn, spec, _LR, seed=seed,
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
    tff_traffic = communication.round_traffic(process.next)
    assert tff_traffic == traffic == process.declared_traffic["ab_round"]

    clients = [(rng.normal(size=(n, 4)).astype(np.float32),
                rng.normal(size=(n, 2, 3)).astype(np.float32)) for n in (4, 6, 2)]
    counts = [n for n in (4, 6, 2)]
    datasets = [tf.data.Dataset.from_tensor_slices(c).batch(_BATCH) for c in clients]
    state = process.initialize()
    kernel, a = w0.reshape(4, 6).astype(np.float64), a0
    for t in (1, 2):
        state = process.next_round(state, datasets).state
        (a_new, b_new), (kernel_new,) = process.get_model_weights(state)
        local = [_local_sgd(a, np.zeros((2, 6)), kernel, x, y.reshape(-1, 6), _LR, _BATCH, "ab",
                            scale) for x, y in clients]
        kernel = kernel + scale * _weighted_mean([ai @ bi for ai, bi in local], counts)
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
    w1, w2 = _W0[:, :3], _RNG.normal(size=(3, 3)).astype(np.float32)
    a1, a2 = _A0, _RNG.normal(size=(3, 2)).astype(np.float32)
    process = lora_fl.build_flora(
        _model_fn([(w1, a1), (w2, a2)], scale=2.0, link=True), _spec(_D_IN, 3), _LR,
        loss_fn=tf.keras.losses.MeanSquaredError,
        aggregator=tff.aggregators.UnweightedMeanFactory())
    with pytest.raises(Exception):  # why the fallback exists; if TFF learns it, drop the fallback
        tff.backends.mapreduce.get_distribute_aggregate_form_for_computation(process.next)
    factor_bytes = (_D_IN * 2 + 2 * 3 + 3 * 2 + 2 * 3) * 4
    metric_sums, weight = 3 * 4, 4
    upload = factor_bytes + metric_sums + weight
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": upload}
    traffic = lora_fl.traffic_per_communication_round(process)["ab_round"]
    assert traffic.up == upload
    assert traffic.down == (_D_IN * 2 + 2 * 3 + 3 * 2 + 2 * 3 + _D_IN * 3 + 3 * 3) * 4
    assert communication.round_traffic(process.next) == traffic
    output = process.next_round(process.initialize(), _datasets(_CLIENTS, _BATCH))
    (new_a1, new_b1, new_a2, new_b2), (new_w1, new_w2) = process.get_model_weights(output.state)

    products = [[], []]
    for x, y in _CLIENTS:   # one client's joint SGD on (A1, B1, A2, B2), numpy, float64
        f = [m.astype(np.float64) for m in (a1, np.zeros((2, 3)), a2, np.zeros((2, 3)))]
        for s in range(0, len(x), _BATCH):
            xb, yb = x[s:s + _BATCH].astype(np.float64), y[s:s + _BATCH].astype(np.float64)
            h = xb @ w1 + 2.0 * xb @ f[0] @ f[1]
            g = 2.0 / yb.size * (h @ w2 + 2.0 * h @ f[2] @ f[3] - yb)
            gh = g @ (w2 + 2.0 * f[2] @ f[3]).T
            grads = [2.0 * xb.T @ gh @ f[1].T, 2.0 * (xb @ f[0]).T @ gh,
                     2.0 * h.T @ g @ f[3].T, 2.0 * (h @ f[2]).T @ g]
            f = [v - _LR * gv for v, gv in zip(f, grads)]
        products[0].append(f[0] @ f[1])
        products[1].append(f[2] @ f[3])
    np.testing.assert_allclose(new_w1, w1 + 2.0 * np.mean(products[0], axis=0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(new_w2, w2 + 2.0 * np.mean(products[1], axis=0), rtol=1e-5,
                               atol=1e-5)
    for k, (a, b, d_in) in enumerate([(new_a1, new_b1, _D_IN), (new_a2, new_b2, 3)]):
        bound = 1.0 / np.sqrt(d_in)
        np.testing.assert_array_equal(a, tf.random.stateless_uniform(
            (d_in, 2), seed=[0, 1 * 2 + k], minval=-bound, maxval=bound).numpy())
        np.testing.assert_array_equal(b, np.zeros((2, 3)))


def test_flora_with_a_head(tff_runtime):
    """FLoRA with a trained `head` (extra role): ŷ = (x·W0 + ½·x·A·B)·H + c, MSE, weighted mean.
    The head is aggregated as deltas by the aggregator (H ← Σ p_i H_i, c ← Σ p_i c_i) while the
    factors are stacked into W0 (numpy backprop). Upload = A, B, H, c + 16 bytes."""
    h0 = _RNG.normal(size=(_D_OUT, 2)).astype(np.float32)
    c0 = _RNG.normal(size=2).astype(np.float32)

    def model_fn():
        x = tf.keras.Input((_D_IN,))
        head = tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(h0),
                                     bias_initializer=tf.constant_initializer(c0))
        y = head(_LinearLora(_W0, _A0, scale=0.5, link=True, name="lora")(x))
        roles.tag_layer(head, roles.HEAD)
        return tf.keras.Model(x, y)

    process = lora_fl.build_flora(model_fn, _spec(_D_IN, 2), _LR,
                                  loss_fn=tf.keras.losses.MeanSquaredError)
    upload = (_D_IN * _R + _R * _D_OUT + _D_OUT * 2 + 2) * 4 + 3 * 4 + 4   # + sums, n_i
    assert process.declared_traffic["ab_round"].up == upload
    # TFF's sizing: the head's `MeanFactory` carries its own copy of n_i (4 more bytes).
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": upload + 4}
    # TFF's MapReduceForm: n_i once more (the stacking aggregate and the head's mean each sum it).
    assert communication.round_traffic(process.next).up == upload + 4
    clients = [(x, _RNG.normal(size=(len(x), 2)).astype(np.float32)) for x, _ in _CLIENTS]
    output = process.next_round(process.initialize(), _datasets(clients, _BATCH))
    (_, b_new, h_new, c_new), (w_new,) = process.get_model_weights(output.state)

    products, heads, biases = [], [], []
    for x, y in clients:
        a, b, h, c = (m.astype(np.float64) for m in (_A0, np.zeros((_R, _D_OUT)), h0, c0))
        for s in range(0, len(x), _BATCH):
            xb, yb = x[s:s + _BATCH].astype(np.float64), y[s:s + _BATCH].astype(np.float64)
            z = xb @ _W0 + 0.5 * xb @ a @ b
            g = 2.0 / yb.size * (z @ h + c - yb)
            gz = g @ h.T
            a, b, h, c = (a - _LR * 0.5 * xb.T @ gz @ b.T, b - _LR * 0.5 * (xb @ a).T @ gz,
                          h - _LR * z.T @ g, c - _LR * g.sum(0))
        products.append(a @ b)
        heads.append(h)
        biases.append(c)
    np.testing.assert_allclose(w_new, _W0 + 0.5 * _weighted_mean(products, _COUNTS), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(h_new, _weighted_mean(heads, _COUNTS), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_new, _weighted_mean(biases, _COUNTS), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b_new, np.zeros((_R, _D_OUT)))


def test_flora_trains_the_relu_toy_net_through_its_base_kernel(tff_runtime):
    """FLoRA on RoLoRA's ReLU toy net with a linked zero W0 (`base_kernel=True`) and an initial
    B ≠ 0 (`b_stddev`): round 1 merges A·B into W0; round 2 starts from B = 0, where
    ReLU(x·W0) ≠ 0 still gives ∇B ≠ 0, so W0 moves again (with W0 = 0 nothing ever would)."""
    def model_fn():
        return build_rolora_mnist_net(input_dim=12, rank=3, num_classes=4, a_stddev=0.5,
                                      b_stddev=0.1, base_kernel=True)

    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_flora(model_fn, spec, client_learning_rate=0.5)
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
        lora_fl.build_flora(_model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), 0.1)


def test_flexlora_svd_has_rank_r_and_is_exact_for_rank_r_means(tff_runtime):
    """FlexLoRA (r = 2, d_in = 4, d_out = 3), two cases from A0, B = 0, against numpy:
    (1) one local step per client: ∇_A = xᵀ·G·Bᵀ = 0 at B = 0, so A_i = A0 and every product
    A0·B_i lies in the column space of A0; mean_i(A0·B_i) has rank ≤ r and FlexLoRA reproduces
    it exactly (A·B = A0·B̄). (2) 1-example batches (several steps, A moves): mean_i(A_iB_i) has
    rank 3 > r; A·B is its best rank-2 approximation U_2 S_2 V_2ᵀ (rank exactly 2) and the factors
    are balanced, AᵀA = B·Bᵀ = S_2."""
    process = _small_process("flexlora")
    state = process.initialize()
    one_step = process.next_round(state, _datasets(_CLIENTS, 100)).state
    a_new, b_new = process.get_model_weights(one_step).trainable
    b_locals = [_local_sgd(_A0, np.zeros((_R, _D_OUT)), _W0, x, y, _LR, 100, "ab")[1]
                for x, y in _CLIENTS]
    mean_product = _weighted_mean([_A0 @ b for b in b_locals], _COUNTS)
    assert np.linalg.matrix_rank(mean_product) == _R
    np.testing.assert_allclose(a_new @ b_new, mean_product, rtol=1e-4, atol=1e-6)

    many_steps = process.next_round(state, _datasets(_CLIENTS, 1)).state
    a_new, b_new = process.get_model_weights(many_steps).trainable
    local = [_local_sgd(_A0, np.zeros((_R, _D_OUT)), _W0, x, y, _LR, 1, "ab") for x, y in _CLIENTS]
    u, s, vt = np.linalg.svd(_weighted_mean([a @ b for a, b in local], _COUNTS))
    assert s[2] > 1e-3 * s[0]   # rank 3 > r
    product = a_new @ b_new
    np.testing.assert_allclose(product, (u[:, :2] * s[:2]) @ vt[:2], rtol=1e-4, atol=1e-6)
    assert np.linalg.svd(product, compute_uv=False)[2] < 1e-5 * s[0]
    np.testing.assert_allclose(a_new.T @ a_new, np.diag(s[:2]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b_new @ b_new.T, np.diag(s[:2]), rtol=1e-4, atol=1e-6)


def client_factors_by_fedavg(fedavg, a, b, datasets):
    """Each client's trained (A_i, B_i) from (a, b), read off a FedAvg-LoRA round on that client
    alone (its mean is A + ΔA_i = A_i): the same client training, none of FlexLoRA's server
    math (stacking, SVD)."""
    factors = []
    for dataset in datasets:
        state = fedavg.initialize()
        weights = fedavg.get_model_weights(state)
        state = fedavg.set_model_weights(state, tff.learning.models.ModelWeights(
            trainable=[np.asarray(a, np.float32), np.asarray(b, np.float32)],
            non_trainable=weights.non_trainable))
        trained = fedavg.get_model_weights(fedavg.next(state, [dataset]).state).trainable
        factors.append(tuple(np.asarray(v, np.float64) for v in trained))
    return factors


def check_flexlora_round(a, b, factors, counts, a_new, b_new, atol=1e-6):
    """FlexLoRA's round with the product-upload formula (numpy, float64): P = A·B +
    Σ p_i(A_iB_i − A·B), p_i = n_i/Σn, P = U S Vᵀ; the new A·B is U_r S_r V_rᵀ (r = A's columns)
    and A, B are the √-split, so the singular values of both are √s_1..√s_r."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    p = np.asarray(counts, np.float64) / np.sum(counts)
    product = a @ b + sum(pi * (ai @ bi - a @ b) for pi, (ai, bi) in zip(p, factors))
    u, s, vt = np.linalg.svd(product)
    r = a.shape[1]
    a_new, b_new = np.asarray(a_new, np.float64), np.asarray(b_new, np.float64)
    np.testing.assert_allclose(a_new @ b_new, (u[:, :r] * s[:r]) @ vt[:r], rtol=1e-6, atol=atol)
    for factor in (a_new, b_new):
        np.testing.assert_allclose(np.linalg.svd(factor, compute_uv=False), np.sqrt(s[:r]),
                                   rtol=1e-6, atol=atol)
    return s


def test_flexlora_uploads_the_factors_and_follows_the_product_formula(tff_runtime):
    """FlexLoRA (r = 2, d_in = 4, d_out = 3, three clients) uploads A_i, B_i: (4·2 + 2·3)
    float32, the 12 bytes of metric sums and the 4-byte weight n_i (TFF's MapReduceForm sizing
    and the declared figure agree). Two rounds from (A0, B0 ≠ 0): the server's factors equal the
    product-upload formula (`check_flexlora_round`), the clients' factors read off single-client
    FedAvg-LoRA rounds (themselves checked against numpy SGD)."""
    process = _small_process("flexlora")
    factor_bytes = (_D_IN * _R + _R * _D_OUT) * 4
    up = factor_bytes + 3 * 4 + 4
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": up}
    assert process.traffic["ab_round"] == process.declared_traffic["ab_round"]
    assert communication.round_traffic(process.next).up == up
    fedavg = _small_process("fedavg_lora")
    state, datasets = _start(process), _datasets(_CLIENTS, _BATCH)
    a, b = _A0, _B0
    for t in (1, 2):
        state = process.next_round(state, datasets).state
        a_new, b_new = process.get_model_weights(state).trainable
        factors = client_factors_by_fedavg(fedavg, a, b, datasets)
        for (ai, bi), (x, y) in zip(factors, _CLIENTS):
            sgd_a, sgd_b = _local_sgd(a, b, _W0, x, y, _LR, _BATCH, "ab")
            np.testing.assert_allclose(ai, sgd_a, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(bi, sgd_b, rtol=1e-5, atol=1e-5)
        s = check_flexlora_round(a, b, factors, _COUNTS, a_new, b_new)
        assert s[2] > 1e-3 * s[0], (t, s)   # rank 3 > r: the truncation acts
        a, b = a_new, b_new


def test_flexlora_bytes_up_with_a_head(tff_runtime):
    """FlexLoRA on LowRankDense(12 → 6, r = 2) + a Dense(3) head (extra role): the declared
    upload is the factors (12·2 + 2·6) + the head deltas (6·3 + 3) as float32 + 12 bytes of
    metric sums + the 4-byte n_i; TFF's sizing (MapReduceForm) counts n_i once more, because the
    head's `MeanFactory` sums it beside the stacking (as FLoRA's, `test_flora_with_a_head`)."""
    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_flexlora(_lora_with_head, spec, 0.1)
    up = (12 * 2 + 2 * 6) * 4 + (6 * 3 + 3) * 4 + 3 * 4 + 4
    assert process.declared_traffic["ab_round"].up == up
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": up + 4}
    assert process.traffic["ab_round"].down == (12 * 2 + 2 * 6 + 6 * 3 + 3) * 4


def test_fedavg_lora_averaging_error_against_numpy(tff_runtime, tmp_path):
    """`averaging_error=True` (two clients of 4 and 6 examples, weights p_i = n_i/Σn, two rounds
    through `tffl.simulation.driver.run_rounds`): metrics.csv's `finalizer/averaging_error` is
    ‖Ā·B̄ − Σp_iA_iB_i‖_F / ‖Σp_iA_iB_i − A·B‖_F with numpy SGD's client factors from the round's
    (A, B); the bytes per client, the declared traffic and the states equal plain FedAvg-LoRA's."""
    clients = _CLIENTS[:2]
    counts = _COUNTS[:2]
    measured = _small_process("fedavg_lora", averaging_error=True)
    plain = _small_process("fedavg_lora")
    assert measured.traffic == plain.traffic
    assert measured.declared_traffic == plain.declared_traffic
    datasets = _datasets(clients, _BATCH)
    ids = ["c0", "c1"]
    result = simulation.run_rounds(
        measured, participation.FullParticipation(ids),
        lambda cid, t: datasets[ids.index(cid)], rounds=2, output_dir=tmp_path, log=None,
        tensorboard=False, initial_state=_start(measured))
    rows = simulation.read_metrics(tmp_path / simulation.METRICS_FILE)
    state = _start(plain)
    for row in rows:
        state = plain.next(state, datasets).state
        assert row["bytes_up_per_client"] == plain.traffic["ab_round"].up
    for x, y in zip(measured.get_model_weights(result.state).trainable,
                    plain.get_model_weights(state).trainable):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)

    a, b = _A0.astype(np.float64), _B0.astype(np.float64)
    p = np.asarray(counts, np.float64) / sum(counts)
    for row in rows:
        local = [_local_sgd(a, b, _W0, x, y, _LR, _BATCH, "ab") for x, y in clients]
        a_bar = sum(pi * ai for pi, (ai, _) in zip(p, local))
        b_bar = sum(pi * bi for pi, (_, bi) in zip(p, local))
        mean_product = sum(pi * ai @ bi for pi, (ai, bi) in zip(p, local))
        error = (np.linalg.norm(a_bar @ b_bar - mean_product)
                 / np.linalg.norm(mean_product - a @ b))
        assert error > 1e-3, error
        np.testing.assert_allclose(row["finalizer/averaging_error"], error, rtol=1e-5)
        a, b = a_bar, b_bar
    with pytest.raises(ValueError, match="averaging_error is FedAvg-LoRA's.*'rolora'"):
        _small_process("rolora", averaging_error=True)


def test_weights_of_another_rank_are_rejected(tff_runtime, tmp_path):
    """A rank-2 model's weights cannot be set into, nor a rank-2 checkpoint loaded into, a rank-4
    process: `set_model_weights` raises one ValueError naming the variable and both shapes;
    `tffl.simulation.checkpoint.load` raises `CheckpointMismatchError` naming both shapes."""
    rank2 = _small_process("rolora")
    a4 = np.random.default_rng(5).normal(size=(_D_IN, 4)).astype(np.float32)
    rank4 = lora_fl.build_rolora(_model_fn([(_W0, a4)]), _spec(_D_IN, _D_OUT), _LR,
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
    np.testing.assert_array_equal(rank2.get_model_weights(loaded).trainable[0], _A0)


def _two_layer(d_in, d_hidden, d_out, r, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(d_in, d_hidden)), rng.normal(size=(d_in, r))),
            (rng.normal(size=(d_hidden, d_out)), rng.normal(size=(d_hidden, r)))]


@pytest.mark.parametrize("dims", [(8, 8, 8), pytest.param((6, 5, 3), marks=pytest.mark.large)])
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
    layers = _two_layer(d_in, d_hidden, d_out, r)
    matrices = [(d_in, d_hidden), (d_hidden, d_out)]
    spec = _spec(d_in, d_out)
    metric_sums, weight, client_count = 3 * 4, 4, 4
    metric = metric_sums + weight
    assert lora_fl.METRIC_UPLOAD_BYTES == metric == 16
    b_bytes = sum(r * o * 4 for _, o in matrices)
    a_bytes = sum(r * i * 4 for i, _ in matrices)
    up, down = {}, {}
    for name in ("fedavg_lora", "ffa_lora", "rolora"):
        process = lora_fl.build_lora_process(name, _model_fn(layers), spec, 0.1,
                                             loss_fn=tf.keras.losses.MeanSquaredError)
        up[name] = lora_fl.upload_bytes_per_communication_round(process)
        traffic = lora_fl.traffic_per_communication_round(process)
        down[name] = {k: t.down for k, t in traffic.items()}
        assert {k: t.up for k, t in traffic.items()} == up[name]
        assert list(process.rounds) == list(traffic)
        for round_name, computation in process.rounds.items():   # TFF's own DAF sizing
            assert communication.round_traffic(computation) == traffic[round_name]
    assert up["fedavg_lora"] == {"ab_round": a_bytes + b_bytes + metric}
    assert up["ffa_lora"] == {"b_round": b_bytes + metric}
    assert up["rolora"] == {"b_round": b_bytes + metric, "a_round": a_bytes + metric}
    assert down["fedavg_lora"] == {"ab_round": a_bytes + b_bytes}
    assert down["ffa_lora"] == {"b_round": b_bytes}
    assert down["rolora"] == {"b_round": a_bytes + b_bytes, "a_round": a_bytes + b_bytes}
    # RoLoRA→FFA: one switch round kind; a client uploads the chosen factor's deltas packed
    # into max(|A|, |B|) floats, and gets the round number (int32) beside the weights.
    switching = lora_fl.build_rolora_then_ffa(0.5, 4, _model_fn(layers), spec, 0.1,
                                              loss_fn=tf.keras.losses.MeanSquaredError)
    traffic = lora_fl.traffic_per_communication_round(switching)
    assert {k: (t.down, t.up) for k, t in traffic.items()} == {
        "b_or_a_round": (a_bytes + b_bytes + 4, max(a_bytes, b_bytes) + metric)}
    assert communication.round_traffic(switching.next) == traffic["b_or_a_round"]
    if d_in == d_hidden == d_out:
        assert traffic["b_or_a_round"].up == up["rolora"]["a_round"] == up["rolora"]["b_round"]
        half = (up["fedavg_lora"]["ab_round"] - metric) / 2
        assert up["ffa_lora"]["b_round"] - metric == half
        assert up["rolora"]["b_round"] - metric == half == up["rolora"]["a_round"] - metric

    # Other aggregators: `traffic` is TFF's sizing of what they really move; the declared
    # figure (from the client work's result type) keeps counting n_i.
    summed = lora_fl.build_rolora(_model_fn(layers), spec, 0.1,
                                  aggregator=tff.aggregators.SumFactory(),
                                  loss_fn=tf.keras.losses.MeanSquaredError)
    assert {k: t.up for k, t in summed.declared_traffic.items()} == up["rolora"]
    assert lora_fl.upload_bytes_per_communication_round(summed) == {
        "b_round": b_bytes + metric_sums, "a_round": a_bytes + metric_sums}
    assert {k: communication.round_traffic(c).up for k, c in summed.rounds.items()} == (
        lora_fl.upload_bytes_per_communication_round(summed))
    unweighted = lora_fl.build_rolora(_model_fn(layers), spec, 0.1,
                                      aggregator=tff.aggregators.UnweightedMeanFactory(),
                                      loss_fn=tf.keras.losses.MeanSquaredError)
    assert lora_fl.upload_bytes_per_communication_round(unweighted) == {
        "b_round": b_bytes + metric_sums + client_count,
        "a_round": a_bytes + metric_sums + client_count}


def _row_mse():
    return lambda y, p: tf.reduce_mean(tf.reduce_sum(tf.square(y - p), axis=-1))


def test_linear_theory_rolora_recovers_a_star_ffa_does_not(tff_runtime):
    """rolora.md §2.1: Y_i = X_i a* b*ᵀ (homogeneous, noiseless; N=4, m=40, d=10), f = X a bᵀ with a
    frozen zero base. RoLoRA (10 local GD steps per round, η = 0.1) drives sin θ(a, a*) below 1e-3
    within 30 communication rounds (30 `next` calls, B and A alternating); FFA-LoRA's a never
    moves (15 `next` calls, as before), so its sin θ stays at sin θ(a⁰, a*)."""
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
    datasets = [ds.repeat(10) for ds in _datasets(clients, m)]   # 10 full-batch local steps
    processes = {name: lora_fl.build_lora_process(name, _model_fn(layers), _spec(d, d), 0.1,
                                                  loss_fn=_row_mse)
                 for name in ("rolora", "ffa_lora")}
    angles = {}
    calls = {"rolora": 30, "ffa_lora": 15}   # communication rounds, one per `next`
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
    assert len(angles["rolora"]) == 30
    assert angles["rolora"][-1] < 1e-3, angles["rolora"]
    np.testing.assert_allclose(angles["ffa_lora"], initial, atol=1e-6)


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
    processes = {name: lora_fl.build_lora_process(name, _model_fn([(np.zeros((d, d)), a0)]),
                                                  _spec(d, d), 0.1, loss_fn=_row_mse)
                 for name in ("rolora", "ffa_lora")}
    final = {}
    # Communication rounds (one per `next`): RoLoRA 24 (12 B and 12 A rounds), FFA-LoRA 2.
    for name, m, nexts in (("rolora", 20, 24), ("rolora", 200, 24), ("ffa_lora", 200, 2)):
        problem = rolora_linear(num_clients=n, num_samples=m, dim=d, heterogeneity=gamma, seed=4)
        clients = [(problem.features[i].astype(np.float32),
                    problem.targets[i].astype(np.float32)) for i in range(n)]
        datasets = [ds.repeat(10) for ds in _datasets(clients, m)]   # 10 full-batch GD steps
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


def test_differentially_private_aggregator_composes_with_rolora(tff_runtime):
    """With noise 0, `gaussian_fixed` is the mean over `clients_per_round` of the clipped deltas,
    clip(Δ) = Δ·min(1, c/‖Δ‖): checked per round against numpy. With noise > 0 a round runs and
    gives finite weights. Two `next` calls (a B round, then an A round) on the same data."""
    clip = 0.05
    dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.0, clients_per_round=len(_CLIENTS), clip=clip)
    process = _small_process("rolora", aggregator=dp)
    state, metrics = _run(process, _start(process), _datasets(_CLIENTS, _BATCH), 2)
    assert [sorted(m) for m in metrics] == [["b_round"], ["a_round"]]
    a_new, b_new = process.model_weights(state).trainable

    def clipped_mean(deltas):
        return sum(dl * min(1.0, clip / np.linalg.norm(dl)) for dl in deltas) / len(deltas)

    b_deltas = [_local_sgd(_A0, _B0, _W0, x, y, _LR, _BATCH, "b")[1] - _B0 for x, y in _CLIENTS]
    assert min(np.linalg.norm(dl) for dl in b_deltas) > clip   # clipping really acts
    b_bar = _B0 + clipped_mean(b_deltas)
    np.testing.assert_allclose(b_new, b_bar, rtol=1e-5, atol=1e-6)
    a_deltas = [_local_sgd(_A0, b_bar, _W0, x, y, _LR, _BATCH, "a")[0] - _A0 for x, y in _CLIENTS]
    np.testing.assert_allclose(a_new, _A0 + clipped_mean(a_deltas), rtol=1e-5, atol=1e-6)

    noisy = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=1.0, clients_per_round=len(_CLIENTS), clip=clip)
    process = _small_process("rolora", aggregator=noisy)
    state, _ = _run(process, _start(process), _datasets(_CLIENTS, _BATCH), 2)
    a_new, b_new = process.model_weights(state).trainable
    assert np.isfinite(a_new).all() and np.isfinite(b_new).all()
    assert not np.allclose(b_new, b_bar)


def test_rolora_then_ffa_schedule(tff_runtime):
    """4 communication rounds, first half RoLoRA: a B round and an A round (A moves), then two
    B-only rounds in which A stays fixed. `next` is one `tff.Computation` (one switch round kind,
    `tffl.engine.switch_round`): the client work's state counts the rounds and chooses B or A in-graph,
    and the finalizer reports the kind that ran."""
    process = lora_fl.build_rolora_then_ffa(
        0.5, 4, _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), _LR,
        loss_fn=tf.keras.losses.MeanSquaredError)
    assert isinstance(process.next, tff.Computation)
    state = process.initialize()
    seen = []
    for _ in range(4):
        name = process.round_name(state)
        state, metrics = process.next(state, _datasets(_CLIENTS, _BATCH))
        a, b = process.model_weights(state).trainable
        kind = metrics["finalizer"]["round_kind"]
        seen.append((process.round_num(state), name, kind.decode(), a, b))
    assert [s[:3] for s in seen] == [(1, "b_or_a_round", "b_round"), (2, "b_or_a_round", "a_round"),
                                     (3, "b_or_a_round", "b_round"), (4, "b_or_a_round", "b_round")]
    np.testing.assert_array_equal(seen[0][3], _A0)       # the B round keeps A
    assert not np.allclose(seen[1][3], _A0)              # the A round moves it
    np.testing.assert_array_equal(seen[1][4], seen[0][4])   # ... and keeps B
    np.testing.assert_array_equal(seen[2][3], seen[1][3])   # B-only rounds: A stays fixed
    np.testing.assert_array_equal(seen[3][3], seen[1][3])
    assert not np.allclose(seen[2][4], seen[1][4])       # while B trains
    assert not np.allclose(seen[3][4], seen[2][4])
    # Every round, the post-switch FFA rounds included, against the float64 numpy replica:
    # client i trains the round's factor from the broadcast (A, B); the server takes the
    # example-weighted mean of the trained factor; the other factor is unchanged.
    a, b = _A0.astype(np.float64), np.zeros((_R, _D_OUT))
    for t, factor in enumerate(("b", "a", "b", "b")):
        local = [_local_sgd(a, b, _W0, x, y, _LR, _BATCH, train=factor) for x, y in _CLIENTS]
        if factor == "a":
            a = _weighted_mean([ai for ai, _ in local], _COUNTS)
        else:
            b = _weighted_mean([bi for _, bi in local], _COUNTS)
        np.testing.assert_allclose(seen[t][3], a, rtol=2e-5, atol=1e-6, err_msg=f"A, round {t + 1}")
        np.testing.assert_allclose(seen[t][4], b, rtol=2e-5, atol=1e-6, err_msg=f"B, round {t + 1}")


def _lora_with_head():
    """x (12) → LowRankDense(6, rank 2) [A: lora_a, B: lora_b] → Dense(3) logits [role head]."""
    x = tf.keras.Input((12,))
    head = tf.keras.layers.Dense(3, name="head")
    logits = head(LowRankDense(6, 2, stddev=0.5, seed=0, name="lora")(x))
    roles.tag_layer(head, roles.HEAD)
    return tf.keras.Model(x, logits)


def test_rolora_with_a_head_runs_in_the_simulation_loop(tff_runtime, tmp_path):
    """RoLoRA on a classifier whose head (role `head`) is trained and uploaded in both rounds,
    driven by `tffl.simulation.driver.run_rounds` (metrics, checkpoints, resume): one row per
    communication round (B, A, B, A, ...), and the state's `round_num` counts them."""
    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_rolora(_lora_with_head, spec, client_learning_rate=0.5)
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
    first = simulation.run_rounds(process, sampler, client_dataset_fn, rounds=4,
                                  output_dir=tmp_path, log=None)
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
    resumed = simulation.run_rounds(process, sampler, client_dataset_fn, rounds=6,
                                    output_dir=tmp_path, resume=True, log=None)
    assert resumed.first_round == 5 and process.round_num(resumed.state) == 6
    assert [row["communication_rounds"] for row in resumed.history] == [1, 2, 3, 4, 5, 6]


def _dense_only():
    x = tf.keras.Input((3,))
    return tf.keras.Model(x, tf.keras.layers.Dense(2)(x))


def test_model_without_lora_variables_is_rejected():
    with pytest.raises(ValueError, match="no trainable LoRA factors"):
        lora_fl.build_rolora(_dense_only, _spec(3, 2), 0.1)


def test_unknown_algorithm_and_bad_learning_rate():
    with pytest.raises(ValueError, match="unknown LoRA algorithm 'fedsgd'"):
        lora_fl.build_lora_process("fedsgd", _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), 0.1)
    with pytest.raises(ValueError, match="client_learning_rate=0 must be a finite number > 0"):
        lora_fl.build_lora_process("rolora", _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), 0)
    with pytest.raises(ValueError, match="extra_roles may hold"):
        lora_fl.build_ffa_lora(_model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), 0.1,
                               extra_roles=(roles.LORA_A,))
    with pytest.raises(ValueError, match="rolora_fraction=1.5"):
        lora_fl.build_rolora_then_ffa(1.5, 10, _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), 0.1)


@pytest.mark.parametrize("name", ["rolora", "flexlora"])
def test_client_work_is_pinned_to_the_given_device(tff_runtime, name):
    """`client_device` places every op of the client computations on that device (read off the
    serialized graphs); TFF's worker (CPU only) soft-places them, and the round is unchanged."""
    from tffl import production

    pinned = _small_process(name, client_device="/device:CPU:1")
    plain = _small_process(name)
    assert list(pinned.rounds) == list(plain.rounds) == (
        ["b_round", "a_round"] if name == "rolora" else ["ab_round"])
    for round_name in pinned.rounds:   # each round kind is a federated computation
        assert b"/device:CPU:1" in production.serialize(pinned.rounds[round_name])
        assert b"/device:CPU:1" not in production.serialize(plain.rounds[round_name])
    # One `next` per round kind (RoLoRA: a B and an A round) on the same data.
    state_pinned, _ = _run(pinned, _start(pinned), _datasets(_CLIENTS, _BATCH),
                           len(pinned.rounds))
    state_plain, _ = _run(plain, _start(plain), _datasets(_CLIENTS, _BATCH), len(plain.rounds))
    for x, y in zip(pinned.get_model_weights(state_pinned).trainable,
                    plain.get_model_weights(state_plain).trainable):
        np.testing.assert_allclose(x, y, rtol=1e-6)
