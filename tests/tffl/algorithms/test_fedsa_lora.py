"""FedSA-LoRA (`personalized.build_personalized_process("fedsa_lora", ...)`): A shared, B personal.

Checked against an independent float64 numpy replica of the paper's round on the small LoRA
problem of `test_lora_fl` (one layer ŷ = x·W0 + x·A·B, d_in=4, d_out=3, r=2, three clients of
4, 6 and 2 examples, batch 2): client i runs SGD on (A, B_i) from (A_global, its own B_i); the
server averages the A_i weighted by examples; client i keeps its B_i for the next round.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.tffl.algorithms.lora_linear import A0, BATCH, CLIENTS, COUNTS, D_IN, D_OUT, LR, R, W0
from tests.tffl.algorithms.lora_linear import (
    client_datasets,
    linear_model_fn,
    linear_spec,
    local_sgd,
    weighted_mean,
)
from tffl.algorithms import personalized


def _process(**kwargs):
    return personalized.build_personalized_process(
        "fedsa_lora", linear_model_fn([(W0, A0)]), linear_spec(D_IN, D_OUT), LR,
        loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


def test_two_rounds_equal_numpy_a_averaged_b_kept(tff_runtime):
    process = _process()
    rng = np.random.default_rng(3)
    # Distinct non-zero personal B_i, as after some rounds (B = 0 would freeze A's first step).
    b_start = [(0.5 * rng.normal(size=(R, D_OUT))).astype(np.float32) for _ in CLIENTS]
    assert [np.shape(v) for v in process.initialize_personal("x")] == [(R, D_OUT)]
    np.testing.assert_array_equal(process.initialize_personal("x")[0], np.zeros((R, D_OUT)))
    state, personal = process.initialize(), [[b] for b in b_start]
    a, bs = A0.astype(np.float64), [b.astype(np.float64) for b in b_start]
    for _ in range(2):
        out = process.next(state, client_datasets(CLIENTS, BATCH), personal)
        state, personal = out.state, out.personal_states
        local = [local_sgd(a, b, W0, x, y, LR, BATCH, train="ab")
                 for (x, y), b in zip(CLIENTS, bs)]
        a = weighted_mean([ai for ai, _ in local], COUNTS)
        bs = [bi for _, bi in local]
        federated = process.get_model_weights(state).trainable
        assert len(federated) == 1  # only A is on the server
        np.testing.assert_allclose(federated[0], a, rtol=2e-5, atol=1e-6)
        for got, want in zip(personal, bs):
            np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=1e-6)
    # The clients' B factors differ: they were never averaged.
    assert not np.allclose(personal[0][0], personal[1][0])


def test_only_a_travels():
    process = _process()
    factor_bytes = 4 * D_IN * R
    assert process.traffic["round"].down == factor_bytes
    assert process.traffic["round"].up == factor_bytes + personalized.METRIC_UPLOAD_BYTES


def test_fedsa_lora_needs_lora_factors_and_joint_rounds():
    def plain():
        inputs = tf.keras.Input((D_IN,))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(D_OUT)(inputs))

    with pytest.raises(ValueError, match="fedsa_lora shares the LoRA A factors"):
        personalized.build_personalized_process(
            "fedsa_lora", plain, linear_spec(D_IN, D_OUT), LR,
            loss_fn=tf.keras.losses.MeanSquaredError)
    with pytest.raises(ValueError, match="lora_schedule='joint'"):
        _process(lora_schedule="alternating")
