"""tffl.algorithms.lora_fl: FlexLoRA (truncated SVD of the mean product) against numpy.

The linear model and its numpy replica are `lora_linear`'s (see test_lora_fl).
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests.tffl.algorithms.lora_linear import (
    A0,
    B0,
    BATCH,
    CLIENTS,
    COUNTS,
    D_IN,
    D_OUT,
    LR,
    W0,
    R,
    check_flexlora_round,
    client_datasets,
    client_factors_by_fedavg,
    linear_model_fn,
    linear_spec,
    local_sgd,
    lora_with_head,
    small_process,
    start,
    weighted_mean,
)
from tffl.algorithms import lora_fl


def test_flexlora_is_truncated_svd_of_mean_product(tff_runtime):
    """FlexLoRA with r=1 < rank of mean_i(A_iB_i): A·B = best rank-1 approximation (numpy SVD),
    A = U_1·√s_1 and B = √s_1·V_1ᵀ so AᵀA = B·Bᵀ = s_1."""
    a0 = A0[:, :1]
    process = lora_fl.build_flexlora(linear_model_fn([(W0, a0)]), linear_spec(D_IN, D_OUT), LR,
                                     loss_fn=tf.keras.losses.MeanSquaredError)
    b0 = B0[:1]
    state = process.initialize()
    weights = process.get_model_weights(state)
    state = process.set_model_weights(state, tff.learning.models.ModelWeights(
        trainable=[weights.trainable[0], b0], non_trainable=weights.non_trainable))
    output = process.next_round(state, client_datasets(CLIENTS, BATCH))
    a_new, b_new = process.get_model_weights(output.state).trainable

    local = [local_sgd(a0, b0, W0, x, y, LR, BATCH, "ab") for x, y in CLIENTS]
    u, s, vt = np.linalg.svd(weighted_mean([a @ b for a, b in local], COUNTS))
    assert s[1] > 1e-3 * s[0]   # the mean product really has rank > 1
    np.testing.assert_allclose(a_new @ b_new, s[0] * np.outer(u[:, 0], vt[0]), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(a_new.T @ a_new, [[s[0]]], rtol=1e-4)
    np.testing.assert_allclose(b_new @ b_new.T, [[s[0]]], rtol=1e-4)


def test_flexlora_svd_has_rank_r_and_is_exact_for_rank_r_means(tff_runtime):
    """FlexLoRA (r = 2, d_in = 4, d_out = 3), two cases from A0, B = 0, against numpy:
    (1) one local step per client: ∇_A = xᵀ·G·Bᵀ = 0 at B = 0, so A_i = A0 and every product
    A0·B_i lies in the column space of A0; mean_i(A0·B_i) has rank ≤ r and FlexLoRA reproduces
    it exactly (A·B = A0·B̄). (2) 1-example batches (several steps, A moves): mean_i(A_iB_i) has
    rank 3 > r; A·B is its best rank-2 approximation U_2 S_2 V_2ᵀ (rank exactly 2) and the factors
    are balanced, AᵀA = B·Bᵀ = S_2."""
    process = small_process("flexlora")
    state = process.initialize()
    one_step = process.next_round(state, client_datasets(CLIENTS, 100)).state
    a_new, b_new = process.get_model_weights(one_step).trainable
    b_locals = [local_sgd(A0, np.zeros((R, D_OUT)), W0, x, y, LR, 100, "ab")[1]
                for x, y in CLIENTS]
    mean_product = weighted_mean([A0 @ b for b in b_locals], COUNTS)
    assert np.linalg.matrix_rank(mean_product) == R
    np.testing.assert_allclose(a_new @ b_new, mean_product, rtol=1e-4, atol=1e-6)

    many_steps = process.next_round(state, client_datasets(CLIENTS, 1)).state
    a_new, b_new = process.get_model_weights(many_steps).trainable
    local = [local_sgd(A0, np.zeros((R, D_OUT)), W0, x, y, LR, 1, "ab") for x, y in CLIENTS]
    u, s, vt = np.linalg.svd(weighted_mean([a @ b for a, b in local], COUNTS))
    assert s[2] > 1e-3 * s[0]   # rank 3 > r
    product = a_new @ b_new
    np.testing.assert_allclose(product, (u[:, :2] * s[:2]) @ vt[:2], rtol=1e-4, atol=1e-6)
    assert np.linalg.svd(product, compute_uv=False)[2] < 1e-5 * s[0]
    np.testing.assert_allclose(a_new.T @ a_new, np.diag(s[:2]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b_new @ b_new.T, np.diag(s[:2]), rtol=1e-4, atol=1e-6)


def test_flexlora_uploads_the_factors_and_follows_the_product_formula(tff_runtime):
    """FlexLoRA (r = 2, d_in = 4, d_out = 3, three clients) uploads A_i, B_i: (4·2 + 2·3)
    float32, the 12 bytes of metric sums and the 4-byte weight n_i (TFF's MapReduceForm sizing
    and the declared figure agree). Two rounds from (A0, B0 ≠ 0): the server's factors equal the
    product-upload formula (`check_flexlora_round`), the clients' factors read off single-client
    FedAvg-LoRA rounds (themselves checked against numpy SGD)."""
    process = small_process("flexlora")
    factor_bytes = (D_IN * R + R * D_OUT) * 4
    up = factor_bytes + 3 * 4 + 4
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": up}
    assert process.traffic["ab_round"] == process.declared_traffic["ab_round"]
    assert process.next is process.rounds["ab_round"]   # the round `traffic` sized
    fedavg = small_process("fedavg_lora")
    state, datasets = start(process), client_datasets(CLIENTS, BATCH)
    a, b = A0, B0
    for t in (1, 2):
        state = process.next_round(state, datasets).state
        a_new, b_new = process.get_model_weights(state).trainable
        factors = client_factors_by_fedavg(fedavg, a, b, datasets)
        for (ai, bi), (x, y) in zip(factors, CLIENTS):
            sgd_a, sgd_b = local_sgd(a, b, W0, x, y, LR, BATCH, "ab")
            np.testing.assert_allclose(ai, sgd_a, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(bi, sgd_b, rtol=1e-5, atol=1e-5)
        s = check_flexlora_round(a, b, factors, COUNTS, a_new, b_new)
        assert s[2] > 1e-3 * s[0], (t, s)   # rank 3 > r: the truncation acts
        a, b = a_new, b_new


def test_flexlora_bytes_up_with_a_head(tff_runtime):
    """FlexLoRA on LowRankDense(12 → 6, r = 2) + a Dense(3) head (extra role): the declared
    upload is the factors (12·2 + 2·6) + the head deltas (6·3 + 3) as float32 + 12 bytes of
    metric sums + the 4-byte n_i; TFF's sizing (MapReduceForm) counts n_i once more, because the
    head's `MeanFactory` sums it beside the stacking (as FLoRA's, `test_flora_with_a_head`)."""
    spec = (tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None], tf.int32))
    process = lora_fl.build_flexlora(lora_with_head, spec, 0.1)
    up = (12 * 2 + 2 * 6) * 4 + (6 * 3 + 3) * 4 + 3 * 4 + 4
    assert process.declared_traffic["ab_round"].up == up
    assert lora_fl.upload_bytes_per_communication_round(process) == {"ab_round": up + 4}
    assert process.traffic["ab_round"].down == (12 * 2 + 2 * 6 + 6 * 3 + 3) * 4
