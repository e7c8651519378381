"""The int8 base (`models.base_precision`): blockwise absmax against the definition written here
in numpy, and the int8 layers against the float32 computation on the widened weights."""

import numpy as np
import pytest
import tensorflow as tf

from models import base_precision
from models.gemma3_backbone import Gemma3Embedding
from models.lora_layers import LoraDense, LoraEinsumDense


def _blockwise(weight, axis, block=32):
    """The definition: along `axis`, blocks of `block` consecutive inputs (the whole axis when
    its size is not a multiple), each with s = max |W| / 127 and W ≈ round(W / s)·s; returns the
    widened weights and the scales per element, by loops over the other axes."""
    moved = np.moveaxis(np.asarray(weight, np.float64), axis, -1)
    width = moved.shape[-1]
    block = block if width % block == 0 else width
    widened, scales = np.empty_like(moved), np.empty_like(moved)
    for index in np.ndindex(moved.shape[:-1]):
        for start in range(0, width, block):
            values = moved[index][start:start + block]
            scale = np.abs(values).max() / 127 or 1.0
            widened[index][start:start + block] = np.round(values / scale) * scale
            scales[index][start:start + block] = scale
    return np.moveaxis(widened, -1, axis), np.moveaxis(scales, -1, axis)


@pytest.mark.parametrize("shape, axis", [((64, 3), 0), ((5, 96), 1), ((8, 2, 4), 0),
                                         ((3, 40), 1)])
def test_absmax_int8_is_the_blockwise_definition(shape, axis):
    weight = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    q, scale = base_precision.absmax_int8(weight, axis)
    assert q.dtype == np.int8 and np.abs(q).max() <= 127
    widened = base_precision.widen(q, scale, axis).numpy()
    expected, scales = _blockwise(weight, axis)
    np.testing.assert_allclose(widened, expected, rtol=1e-6, atol=1e-7)
    assert np.all(np.abs(widened - weight) <= scales / 2 * (1 + 1e-6))
    blocks = shape[axis] // 32 if shape[axis] % 32 == 0 else 1
    assert scale.shape == shape[:axis] + (blocks,) + shape[axis + 1:]


def test_a_table_is_quantized_a_slice_of_rows_at_a_time_to_the_same_values(monkeypatch):
    table = np.random.default_rng(2).normal(size=(70, 64)).astype(np.float32)
    whole = base_precision.absmax_int8(table, 1)
    monkeypatch.setattr(base_precision, "TABLE_ROWS", 16)
    sliced = base_precision.absmax_int8(table, 1)
    for a, b in zip(whole, sliced):
        np.testing.assert_array_equal(a, b)
    assert sliced[0].flags.c_contiguous and sliced[1].flags.c_contiguous


def test_an_all_zero_block_has_scale_one_and_zero_levels():
    q, scale = base_precision.absmax_int8(np.zeros((32, 2), np.float32), 0)
    assert not q.any() and np.all(scale == 1.0)


def test_int8_layers_compute_the_float32_layers_on_their_widened_kernels():
    """An int8 `Dense` / `EinsumDense` drawn from an initializer holds that draw quantized by
    the definition, computes x·widen(q, s), round-trips its config, and a LoRA wrapper around
    it starts (B = 0) at the layer's output."""
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(64, 6)).astype(np.float32)
    dense = base_precision.projection("int8", units=6, use_bias=False,
                                      kernel_initializer=tf.keras.initializers.Constant(weights))
    x = rng.normal(size=(2, 5, 64)).astype(np.float32)
    y = dense(x).numpy()
    expected, _ = _blockwise(weights, 0)
    assert dense.kernel.dtype == tf.int8 and dense.kernel_scale.shape == (2, 6)
    assert not dense.trainable_weights
    np.testing.assert_allclose(y, x @ expected, rtol=1e-5, atol=1e-5)
    again = base_precision.Int8Dense.from_config(dense.get_config())
    again.build((None, 64))
    again.set_weights(dense.get_weights())
    np.testing.assert_array_equal(again(x), y)
    lora = LoraDense(dense, rank=2)
    np.testing.assert_allclose(lora(x), y, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="cannot merge into its int8 kernel"):
        lora.merge()

    heads = rng.normal(size=(64, 2, 3)).astype(np.float32)
    einsum = base_precision.projection(
        "int8", "bqm,muh->bquh", output_shape=(None, 2, 3),
        kernel_initializer=tf.keras.initializers.Constant(heads))
    expected, _ = _blockwise(heads, 0)
    out = einsum(x).numpy()
    assert einsum.input_axis == 0 and einsum.kernel_scale.shape == (2, 2, 3)
    np.testing.assert_allclose(out, np.einsum("bqm,muh->bquh", x, expected), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(LoraEinsumDense(einsum, rank=2)(x), out, rtol=1e-6, atol=1e-6)


def test_int8_layers_refuse_a_bias_and_an_unknown_dtype():
    with pytest.raises(ValueError, match="Int8Dense has no bias"):
        base_precision.Int8Dense(4, use_bias=True)
    with pytest.raises(ValueError, match="Int8EinsumDense has no bias"):
        base_precision.Int8EinsumDense("ab,bc->ac", output_shape=4, bias_axes="c")
    with pytest.raises(ValueError, match="base_dtype='int4': choose one of float32, bfloat16, "
                                         "int8"):
        base_precision.projection("int4", units=3)


def test_an_int8_embedding_widens_its_rows_and_its_tied_output_projection():
    """The lookup returns widen(q, s)[ids]; the output projection h·widen(q, s)ᵀ, in blocks of
    rows; the config round-trips."""
    rng = np.random.default_rng(4)
    table = rng.normal(size=(11, 64)).astype(np.float32)
    embedding = Gemma3Embedding(11, 64, base_dtype="int8",
                                embeddings_initializer=tf.keras.initializers.Constant(table))
    ids = np.array([[0, 10, 3], [7, 7, 1]], np.int32)
    rows = embedding(ids).numpy()
    expected, _ = _blockwise(table, 1)
    assert embedding.embeddings_scale.shape == (11, 2)
    np.testing.assert_allclose(rows, expected[ids], rtol=1e-6, atol=1e-7)
    hidden = rng.normal(size=(4, 64)).astype(np.float32)
    np.testing.assert_allclose(embedding(hidden, reverse=True), hidden @ expected.T,
                               rtol=1e-5, atol=1e-5)
    again = Gemma3Embedding.from_config(embedding.get_config())
    assert again.base_dtype == "int8"
    again.build()
    again.set_weights(embedding.get_weights())
    np.testing.assert_array_equal(again(ids), rows)
