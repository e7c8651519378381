"""tffl.algorithms.lora_ranks: FlexLoRA and FLoRA with heterogeneous client ranks against numpy.

The numpy reference trains each client's adapter at its own size, A_i ∈ R^{d_in×r_i} and
B_i ∈ R^{r_i×d_out} (the first r_i columns / rows of the server's factors), never a masked
full-size one, on the linear model of `test_lora_fl` (ŷ = x·W0 + s·x·A·B, MSE).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.lora_linear import local_sgd, linear_model_fn, linear_spec, weighted_mean
from tests.tffl.algorithms.lora_linear import check_flexlora_round, client_factors_by_fedavg
from tffl.algorithms import lora_fl
from tffl.algorithms import lora_ranks

_RNG = np.random.default_rng(11)
_D_IN, _D_OUT, _R = 5, 4, 3
_W0 = _RNG.normal(size=(_D_IN, _D_OUT)).astype(np.float32)
_A0 = _RNG.normal(size=(_D_IN, _R)).astype(np.float32)
_B0 = (0.5 * _RNG.normal(size=(_R, _D_OUT))).astype(np.float32)
_CLIENTS = [(_RNG.normal(size=(n, _D_IN)).astype(np.float32),
             _RNG.normal(size=(n, _D_OUT)).astype(np.float32)) for n in (4, 6, 2)]
_COUNTS = [len(x) for x, _ in _CLIENTS]
_IDS = ["c0", "c1", "c2"]
_LR, _BATCH = 0.1, 2


def _datasets():
    return [tf.data.Dataset.from_tensor_slices(c).batch(_BATCH) for c in _CLIENTS]


def _process(algorithm, ranks, **kwargs):
    return lora_fl.build_lora_process(
        algorithm, linear_model_fn([(_W0, _A0)], **kwargs.pop("layer", {})),
        linear_spec(_D_IN, _D_OUT), _LR, loss_fn=tf.keras.losses.MeanSquaredError,
        client_ranks=lora_ranks.assign_ranks(_IDS, ranks), **kwargs)


def test_assign_ranks_in_turn():
    assert lora_ranks.assign_ranks(list("abcde"), (4, 8, 16)) == {
        "a": 4, "b": 8, "c": 16, "d": 4, "e": 8}


def test_flexlora_clients_train_their_rank_truncation(tff_runtime):
    """Ranks (1, 3, 2), from A0 and a non-zero B0, two rounds. In round t client i trains
    A[:, :r_i], B[:r_i] (numpy SGD on both); the server's A·B is the best rank-3 approximation of
    P = Σ p_i A_iB_i (numpy SVD, p_i = n_i/Σn), and its first k columns / rows give P's best
    rank-k approximation, which is what a rank-k client receives. Every client's rank comes back
    unchanged."""
    ranks = (1, 3, 2)
    process = _process("flexlora", ranks)
    assert process.personal.names == ("rank",) and process.personal.shapes == ((),)
    personal = [process.initialize_personal(c) for c in _IDS]
    assert [int(p[0]) for p in personal] == list(ranks)
    state = process.initialize()
    weights = process.get_model_weights(state)
    state = process.set_model_weights(state, tff.learning.models.ModelWeights(
        trainable=[weights.trainable[0], _B0], non_trainable=weights.non_trainable))
    a, b = _A0.astype(np.float64), _B0.astype(np.float64)
    for _ in range(2):
        output = process.next(state, _datasets(), personal)
        state = output.state
        assert [int(np.asarray(p[0])) for p in output.personal_states] == list(ranks)
        local = [local_sgd(a[:, :r], b[:r], _W0, x, y, _LR, _BATCH, "ab")
                 for r, (x, y) in zip(ranks, _CLIENTS)]
        assert [f[0].shape[1] for f in local] == list(ranks)
        u, s, vt = np.linalg.svd(weighted_mean([ai @ bi for ai, bi in local], _COUNTS))
        a_new, b_new = (np.asarray(v, np.float64)
                        for v in process.get_model_weights(state).trainable)
        for k in (1, 2, 3):
            np.testing.assert_allclose(a_new[:, :k] @ b_new[:k], (u[:, :k] * s[:k]) @ vt[:k],
                                       rtol=1e-4, atol=1e-5)
        a, b = a_new, b_new
    # Equal ranks at r: the same numbers as FlexLoRA without client ranks.
    full = _process("flexlora", (3, 3, 3))
    plain = lora_fl.build_flexlora(linear_model_fn([(_W0, _A0)]), linear_spec(_D_IN, _D_OUT), _LR,
                                   loss_fn=tf.keras.losses.MeanSquaredError)
    out_full = full.next(full.initialize(), _datasets(),
                         [full.initialize_personal(c) for c in _IDS])
    out_plain = plain.next(plain.initialize(), _datasets())
    for x, y in zip(full.get_model_weights(out_full.state).trainable,
                    plain.get_model_weights(out_plain.state).trainable):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_flora_stacks_adapters_of_different_ranks(tff_runtime):
    """Linked kernel, scale ½, ranks (2, 1, 3), seed 5, two rounds from A0, B = 0: client i
    trains A[:, :r_i] and B = 0_{r_i×d_out} (numpy); W0 ← W0 + ½·Σ p_i A_iB_i; B = 0 and
    A = stateless_uniform((5, 3), [5, t], ±1/√5) for round t + 1. Bytes: a rank-k client needs
    (3 − k)·(5 + 4) float32 fewer down and up than the rank-3 types."""
    ranks, scale, seed = (2, 1, 3), 0.5, 5
    process = _process("flora", ranks, seed=seed, layer=dict(scale=scale, link=True))
    personal = [process.initialize_personal(c) for c in _IDS]
    state = process.initialize()
    kernel, a = _W0.astype(np.float64), _A0.astype(np.float64)
    for t in (1, 2):
        state = process.next(state, _datasets(), personal).state
        (a_new, b_new), (kernel_new,) = process.get_model_weights(state)
        local = [local_sgd(a[:, :r], np.zeros((r, _D_OUT)), kernel, x, y, _LR, _BATCH, "ab",
                            scale) for r, (x, y) in zip(ranks, _CLIENTS)]
        kernel = kernel + scale * weighted_mean([ai @ bi for ai, bi in local], _COUNTS)
        np.testing.assert_allclose(kernel_new, kernel, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(b_new, np.zeros((_R, _D_OUT)))
        bound = 1.0 / np.sqrt(_D_IN)
        a = tf.random.stateless_uniform((_D_IN, _R), seed=[seed, t], minval=-bound,
                                        maxval=bound).numpy().astype(np.float64)
        np.testing.assert_array_equal(a_new, a.astype(np.float32))

    full = process.traffic["ab_round"]
    assert full.up == (_D_IN * _R + _R * _D_OUT) * 4 + lora_fl.METRIC_UPLOAD_BYTES
    for k in (1, 2, 3):
        at_k = lora_ranks.traffic_at_rank(process, k)["ab_round"]
        assert (full.down - at_k.down, full.up - at_k.up) == ((3 - k) * 9 * 4,) * 2


def test_flexlora_rank_traffic_uploads_the_factors(tff_runtime):
    """FlexLoRA uploads the rank-3 factors, (5·3 + 3·4) float32 + 12 bytes of metric sums + the
    4-byte n_i; a rank-k client needs (3 − k)·(5 + 4) float32 fewer down and up."""
    process = _process("flexlora", (1, 2, 3))
    full = process.traffic["ab_round"]
    assert full.up == (_D_IN * _R + _R * _D_OUT) * 4 + 3 * 4 + 4
    for k in (1, 2, 3):
        at_k = lora_ranks.traffic_at_rank(process, k)["ab_round"]
        assert (full.up - at_k.up, full.down - at_k.down) == ((3 - k) * 9 * 4,) * 2
    mean = process.client_traffic("ab_round", _IDS)   # ranks 1, 2, 3
    assert mean.up == full.up - (2 + 1 + 0) * 9 * 4 / 3
    with pytest.raises(ValueError, match="rank 4 must be between 1 and the adapters' rank 3"):
        lora_ranks.traffic_at_rank(process, 4)


def test_flexlora_ranks_one_and_two_follow_the_product_formula(tff_runtime):
    """Server rank r = 2, client ranks (1, 2, 1), two rounds from (A0, B0 ≠ 0): the server's
    factors equal the product-upload formula on the clients' factors
    (`test_lora_fl.check_flexlora_round`: P = A·B + Σ p_i(A_iB_i − A·B), its rank-2 SVD and
    √-split), the clients' factors read off single-client FedAvg-LoRA rounds from the rank-r_i
    truncation (A·diag(m_i), diag(m_i)·B), and checked against numpy SGD at rank r_i."""
    ranks, r = (1, 2, 1), 2
    a0, b0 = _A0[:, :r], _B0[:r]
    process = lora_fl.build_lora_process(
        "flexlora", linear_model_fn([(_W0, a0)]), linear_spec(_D_IN, _D_OUT), _LR,
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_ranks=lora_ranks.assign_ranks(_IDS, (1, 2)))
    fedavg = lora_fl.build_lora_process("fedavg_lora", linear_model_fn([(_W0, a0)]),
                                        linear_spec(_D_IN, _D_OUT), _LR,
                                        loss_fn=tf.keras.losses.MeanSquaredError)
    assert process.traffic["ab_round"].up == (_D_IN * r + r * _D_OUT) * 4 + 3 * 4 + 4
    personal = [process.initialize_personal(c) for c in _IDS]
    assert [int(p[0]) for p in personal] == list(ranks)
    state = process.initialize()
    weights = process.get_model_weights(state)
    state = process.set_model_weights(state, tff.learning.models.ModelWeights(
        trainable=[a0, b0], non_trainable=weights.non_trainable))
    a, b = a0, b0
    for _ in range(2):
        state = process.next(state, _datasets(), personal).state
        a_new, b_new = process.get_model_weights(state).trainable
        factors = []
        for rank, dataset, (x, y) in zip(ranks, _datasets(), _CLIENTS):
            mask = (np.arange(r) < rank).astype(np.float64)
            (ai, bi), = client_factors_by_fedavg(fedavg, a * mask, mask[:, None] * b, [dataset])
            np.testing.assert_array_equal(ai[:, rank:], 0.0)
            np.testing.assert_array_equal(bi[rank:], 0.0)
            sgd_a, sgd_b = local_sgd(a[:, :rank], b[:rank], _W0, x, y, _LR, _BATCH, "ab")
            np.testing.assert_allclose(ai[:, :rank], sgd_a, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(bi[:rank], sgd_b, rtol=1e-5, atol=1e-5)
            factors.append((ai, bi))
        s = check_flexlora_round(a, b, factors, _COUNTS, a_new, b_new)
        assert s[2] > 1e-3 * s[0], s   # rank(P) = 3 > r: the truncation acts
        a, b = np.asarray(a_new, np.float64), np.asarray(b_new, np.float64)


def test_bad_client_ranks_are_one_line_errors():
    with pytest.raises(ValueError, match=r"client 'c1' has rank 4: client ranks must be between "
                                         r"1 and the adapters' rank 3"):
        _process("flexlora", (2, 4))
    with pytest.raises(ValueError, match="heterogeneous client ranks need flexlora or flora.*"
                                         "'rolora'"):
        _process("rolora", (1, 2))
    with pytest.raises(ValueError, match="at least one rank"):
        lora_ranks.assign_ranks(_IDS, ())
