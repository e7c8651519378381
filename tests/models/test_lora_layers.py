"""LoraDense / LoraEinsumDense: exactness at init, closed-form outputs, roles, config, training."""

import numpy as np
import pytest
import tensorflow as tf

from models.lora_layers import LoraDense, LoraEinsumDense, kernel_dims, wrap_with_lora
from tffl.engine import roles


def _dense(units=6, d_in=5, activation=None, seed=0):
    layer = tf.keras.layers.Dense(
        units, activation=activation, bias_initializer="glorot_uniform",
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed),
    )
    layer.build((None, d_in))
    return layer


def _query(hidden=8, heads=2, head_dim=4):
    layer = tf.keras.layers.EinsumDense(
        "abc,cde->abde", output_shape=(None, heads, head_dim), bias_axes="de",
        bias_initializer="glorot_uniform",
    )
    layer.build((None, None, hidden))
    return layer


def _attn_output(hidden=8, heads=2, head_dim=4):
    layer = tf.keras.layers.EinsumDense(
        "abcd,cde->abe", output_shape=(None, hidden), bias_axes="e",
        bias_initializer="glorot_uniform",
    )
    layer.build((None, None, heads, head_dim))
    return layer


def _randomize_b(lora, seed=1):
    rng = np.random.default_rng(seed)
    lora.lora_b.assign(rng.normal(size=lora.lora_b.shape).astype(np.float32))


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_dense_equals_base_exactly_at_init(activation):
    base = _dense(activation=activation)
    x = tf.random.stateless_normal((4, 3, 5), seed=(1, 2))
    expected = base(x).numpy()
    lora = LoraDense(base, rank=2, alpha=8.0, seed=3)
    np.testing.assert_array_equal(lora(x).numpy(), expected)
    np.testing.assert_array_equal(lora(x[:, 0]).numpy(), base(x[:, 0]).numpy())
    assert not np.any(lora.lora_b.numpy())


def test_dense_matches_numpy_closed_form():
    base = _dense(activation="tanh")
    lora = LoraDense(base, rank=3, alpha=6.0, seed=0)
    _randomize_b(lora)
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    w0, b = base.kernel.numpy(), base.bias.numpy()
    a, bb = lora.lora_a.numpy(), lora.lora_b.numpy()
    expected = np.tanh(x @ w0 + b + (6.0 / 3) * (x @ a @ bb))
    np.testing.assert_allclose(lora(x).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_einsum_query_and_output_match_numpy():
    hidden, heads, head_dim = 8, 2, 4
    x = np.random.default_rng(1).normal(size=(2, 3, hidden)).astype(np.float32)
    q = _query(hidden, heads, head_dim)
    base_out = q(x).numpy()
    lq = LoraEinsumDense(q, rank=2, alpha=4.0, seed=0)
    np.testing.assert_array_equal(lq(x).numpy(), base_out)
    _randomize_b(lq)
    w0 = q.kernel.numpy().reshape(hidden, heads * head_dim)
    flat = x @ w0 + q.bias.numpy().reshape(-1) + 2.0 * (x @ lq.lora_a.numpy() @ lq.lora_b.numpy())
    np.testing.assert_allclose(lq(x).numpy(), flat.reshape(2, 3, heads, head_dim), atol=1e-5)

    o = _attn_output(hidden, heads, head_dim)
    y = np.random.default_rng(2).normal(size=(2, 3, heads, head_dim)).astype(np.float32)
    lo = LoraEinsumDense(o, rank=3, seed=0)
    np.testing.assert_array_equal(lo(y).numpy(), o(y).numpy())
    _randomize_b(lo)
    y_flat = y.reshape(2, 3, heads * head_dim)
    w0 = o.kernel.numpy().reshape(heads * head_dim, hidden)
    expected = y_flat @ w0 + o.bias.numpy() + y_flat @ lo.lora_a.numpy() @ lo.lora_b.numpy()
    np.testing.assert_allclose(lo(y).numpy(), expected, atol=1e-5)
    assert (lo.d_in, lo.d_out) == (heads * head_dim, hidden) == kernel_dims(o)


def test_shapes_roles_and_trainable_variables():
    base = _query(hidden=8, heads=2, head_dim=4)
    lora = LoraEinsumDense(base, rank=2, seed=0)
    assert lora.lora_a.shape == (8, 2) and lora.lora_b.shape == (2, 8)
    assert [roles.role_of(v) for v in (lora.lora_a, lora.lora_b)] == ["lora_a", "lora_b"]
    assert {roles.role_of(v) for v in base.weights} == {"frozen"}
    assert {id(v) for v in lora.trainable_weights} == {id(lora.lora_a), id(lora.lora_b)}
    assert sum(int(np.prod(v.shape)) for v in lora.trainable_weights) == 2 * (8 + 8)


@pytest.mark.parametrize("make", [lambda: _dense(units=6, d_in=5), lambda: _query()])
def test_link_to_base_kernel(make):
    """`tffl.engine.roles.lora_link(A)` names B, the wrapped kernel and the scale α/r."""
    base = make()
    lora = wrap_with_lora(base, rank=2, alpha=3.0)
    link = roles.lora_link(lora.lora_a)
    assert link.lora_b is lora.lora_b and link.base_kernel is base.kernel
    assert link.scale == 1.5
    assert roles.lora_link(lora.lora_b) is None


def test_a_init_is_seeded_and_peft_uniform():
    a1 = LoraDense(_dense(units=40, d_in=30), rank=4, seed=7).lora_a.numpy()
    a2 = LoraDense(_dense(units=40, d_in=30), rank=4, seed=7).lora_a.numpy()
    a3 = LoraDense(_dense(units=40, d_in=30), rank=4, seed=8).lora_a.numpy()
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, a3)
    assert np.abs(a1).max() <= 1 / np.sqrt(30) and np.abs(a1).std() > 0


@pytest.mark.parametrize("rank", [0, -1, 2.5, True])
def test_bad_rank_raises(rank):
    with pytest.raises(ValueError, match="rank"):
        LoraDense(_dense(), rank=rank)


def test_rank_above_min_dim_raises_naming_value():
    with pytest.raises(ValueError, match=r"rank=6 exceeds min\(d_in, d_out\)=min\(5, 6\)"):
        LoraDense(_dense(units=6, d_in=5), rank=6)
    with pytest.raises(ValueError, match="EinsumDense"):
        LoraDense(_query(), rank=1)
    with pytest.raises(ValueError, match="Dense"):
        wrap_with_lora(tf.keras.layers.LayerNormalization(), rank=1)


def test_unsupported_einsum_equation_raises():
    layer = tf.keras.layers.EinsumDense("ab,bc->ac", output_shape=4)
    layer.build((None, 3))
    assert kernel_dims(layer) == (3, 4)
    weird = tf.keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 4))
    LoraEinsumDense(weird, rank=1)  # fine
    with pytest.raises(ValueError, match="Unsupported EinsumDense equation"):
        LoraEinsumDense(tf.keras.layers.EinsumDense("...b,bc->...c", output_shape=4), rank=1)


def test_dropout_only_on_lora_path():
    base = _dense(units=6, d_in=5)
    lora = LoraDense(base, rank=2, dropout=0.5, seed=0)
    x = np.ones((64, 5), np.float32)
    # B = 0: training-mode dropout cannot change anything.
    np.testing.assert_array_equal(lora(x, training=True).numpy(), base(x).numpy())
    _randomize_b(lora)
    inference = base(x).numpy() + x @ lora.lora_a.numpy() @ lora.lora_b.numpy()
    np.testing.assert_allclose(lora(x, training=False).numpy(), inference, atol=1e-5)
    assert not np.allclose(lora(x, training=True).numpy(), inference, atol=1e-3)


@pytest.mark.parametrize("make", [_dense, _query])
def test_get_config_round_trip(make):
    base = make()
    cls = LoraDense if isinstance(base, tf.keras.layers.Dense) else LoraEinsumDense
    lora = cls(base, rank=2, alpha=3.0, dropout=0.1, seed=5, a_initializer="ones")
    config = lora.get_config()
    clone = cls.from_config(config)
    # Keras adds the wrapped layer's "build_config" only once it is built.
    def strip(c):
        return {**c, "layer": {k: v for k, v in c["layer"].items() if k != "build_config"}}

    assert strip(clone.get_config()) == strip(config)
    assert (clone.rank, clone.alpha, clone.dropout, clone.seed) == (2, 3.0, 0.1, 5)
    if not clone.built:
        clone.build((None, 3, 5) if cls is LoraDense else (None, 3, 8))
    np.testing.assert_array_equal(clone.lora_a.numpy(), np.ones(clone.lora_a.shape))
    restored = tf.keras.layers.deserialize(tf.keras.layers.serialize(lora))
    assert type(restored) is cls and strip(restored.get_config()) == strip(config)


def test_merge_unmerge_and_tf_function():
    base = _attn_output()
    lora = LoraEinsumDense(base, rank=2, alpha=5.0, seed=0)
    _randomize_b(lora)
    w0 = base.kernel.numpy().copy()
    y = tf.random.stateless_normal((2, 3, 2, 4), seed=(3, 4))
    unmerged = lora(y).numpy()
    np.testing.assert_allclose(tf.function(lora)(y).numpy(), unmerged, atol=1e-6)
    lora.merge()
    delta = 2.5 * lora.lora_a.numpy() @ lora.lora_b.numpy()
    np.testing.assert_allclose(base.kernel.numpy(), w0 + delta.reshape(w0.shape), atol=1e-6)
    np.testing.assert_allclose(lora(y).numpy(), unmerged, atol=1e-5)
    np.testing.assert_allclose(base(y).numpy(), unmerged, atol=1e-5)
    lora.merge()  # idempotent
    lora.unmerge()
    np.testing.assert_allclose(base.kernel.numpy(), w0, atol=1e-6)
    np.testing.assert_allclose(lora(y).numpy(), unmerged, atol=1e-5)


def _train_step(model, variables, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, variables)
    tf.keras.optimizers.SGD(0.1).apply_gradients(zip(grads, variables))


def test_training_one_factor_leaves_the_other_bit_identical():
    base = _dense(units=6, d_in=5)
    lora = LoraDense(base, rank=2, seed=0)
    x = tf.random.stateless_normal((16, 5), seed=(5, 6))
    y = tf.random.stateless_normal((16, 6), seed=(7, 8))
    a0, b0, w0 = (v.numpy().copy() for v in (lora.lora_a, lora.lora_b, base.kernel))
    _train_step(lora, roles.select(lora.trainable_weights, [roles.LORA_B]), x, y)
    np.testing.assert_array_equal(lora.lora_a.numpy(), a0)
    assert not np.array_equal(lora.lora_b.numpy(), b0)
    b1 = lora.lora_b.numpy().copy()
    _train_step(lora, roles.select(lora.trainable_weights, [roles.LORA_A]), x, y)
    np.testing.assert_array_equal(lora.lora_b.numpy(), b1)
    assert not np.array_equal(lora.lora_a.numpy(), a0)
    np.testing.assert_array_equal(base.kernel.numpy(), w0)
