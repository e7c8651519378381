"""FedSA-LoRA (`personalized.build_personalized_process("fedsa_lora", ...)`): A shared, B personal.

Checked against an independent float64 numpy replica of the paper's round on the small LoRA
problem of `test_lora_fl` (one layer ŷ = x·W0 + x·A·B, d_in=4, d_out=3, r=2, three clients of
4, 6 and 2 examples, batch 2): client i runs SGD on (A, B_i) from (A_global, its own B_i); the
server averages the A_i weighted by examples; client i keeps its B_i for the next round.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.tffl.algorithms.lora_linear import _A0, _BATCH, _CLIENTS, _COUNTS, _D_IN, _D_OUT, _LR, _R, _W0
from tests.tffl.algorithms.lora_linear import _datasets, _local_sgd, _model_fn, _spec, _weighted_mean
from tffl.algorithms import personalized


def _process(**kwargs):
    return personalized.build_personalized_process(
        "fedsa_lora", _model_fn([(_W0, _A0)]), _spec(_D_IN, _D_OUT), _LR,
        loss_fn=tf.keras.losses.MeanSquaredError, **kwargs)


def test_two_rounds_equal_numpy_a_averaged_b_kept(tff_runtime):
    process = _process()
    rng = np.random.default_rng(3)
    # Distinct non-zero personal B_i, as after some rounds (B = 0 would freeze A's first step).
    b_start = [(0.5 * rng.normal(size=(_R, _D_OUT))).astype(np.float32) for _ in _CLIENTS]
    assert [np.shape(v) for v in process.initialize_personal("x")] == [(_R, _D_OUT)]
    np.testing.assert_array_equal(process.initialize_personal("x")[0], np.zeros((_R, _D_OUT)))
    state, personal = process.initialize(), [[b] for b in b_start]
    a, bs = _A0.astype(np.float64), [b.astype(np.float64) for b in b_start]
    for _ in range(2):
        out = process.next(state, _datasets(_CLIENTS, _BATCH), personal)
        state, personal = out.state, out.personal_states
        local = [_local_sgd(a, b, _W0, x, y, _LR, _BATCH, train="ab")
                 for (x, y), b in zip(_CLIENTS, bs)]
        a = _weighted_mean([ai for ai, _ in local], _COUNTS)
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
    factor_bytes = 4 * _D_IN * _R
    assert process.traffic["round"].down == factor_bytes
    assert process.traffic["round"].up == factor_bytes + personalized.METRIC_UPLOAD_BYTES


def test_fedsa_lora_needs_lora_factors_and_joint_rounds():
    def plain():
        inputs = tf.keras.Input((_D_IN,))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(_D_OUT)(inputs))

    with pytest.raises(ValueError, match="fedsa_lora shares the LoRA A factors"):
        personalized.build_personalized_process(
            "fedsa_lora", plain, _spec(_D_IN, _D_OUT), _LR,
            loss_fn=tf.keras.losses.MeanSquaredError)
    with pytest.raises(ValueError, match="lora_schedule='joint'"):
        _process(lora_schedule="alternating")
