"""RoLoRA MNIST net, FedRep/FLUTE CNN and MLP: closed forms, shapes, roles, TFF functional."""

import numpy as np
import pytest
import tensorflow as tf

from models.paper_models import (LowRankDense, RoloraMnistNetConfig, build_lenet_cnn, build_mlp,
                                 build_rolora_mnist_net)
from tffl.engine import roles


def test_rolora_net_matches_closed_form_and_roles():
    model = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, a_stddev=0.5))
    a, b, w_out = (v.numpy() for v in model.weights)
    assert a.shape == (12, 3) and b.shape == (3, 12) and w_out.shape == (12, 4)
    assert [roles.role_of(v) for v in model.weights] == ["lora_a", "lora_b", "frozen"]
    assert [roles.role_of(v) for v in model.trainable_variables] == ["lora_a", "lora_b"]
    assert not b.any() and a.std() > 0
    x = np.random.default_rng(0).normal(size=(5, 12)).astype(np.float32)
    np.testing.assert_array_equal(model(x).numpy(), np.zeros((5, 4)))  # B = 0
    b = np.random.default_rng(1).normal(size=(3, 12)).astype(np.float32)
    model.weights[1].assign(b)
    np.testing.assert_allclose(model(x).numpy(), np.maximum(x @ a @ b, 0) @ w_out, atol=1e-5)
    linear = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, linear=True))
    linear.set_weights([a, b, w_out])
    np.testing.assert_allclose(linear(x).numpy(), x @ a @ b @ w_out, atol=1e-5)


def test_rolora_net_defaults_are_the_papers():
    model = build_rolora_mnist_net()
    assert [tuple(v.shape) for v in model.weights] == [(784, 16), (16, 784), (784, 10)]


def _grads(model, x, y):
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def test_rolora_net_relu_cannot_train_from_b_zero():
    """ReLU(x·A·B) at B = 0: h = 0 and ReLU'(0) = 0, so ∇_A = ∇_B = 0 exactly (the paper's init
    cannot train); the linear net has ∇_B = (x·A)ᵀ·(softmax − onehot)·W_outᵀ/n ≠ 0 (numpy);
    `b_stddev=1e-3` gives B ≠ 0 and non-zero gradients for both factors."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=6)
    relu = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, a_stddev=0.5))
    grad_a, grad_b = _grads(relu, x, y)
    assert not grad_a.any() and not grad_b.any()

    linear = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, a_stddev=0.5, linear=True))
    a, _, w_out = (v.numpy().astype(np.float64) for v in linear.weights)
    logits = np.zeros((6, 4))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - np.eye(4)[y]) / len(x)
    np.testing.assert_allclose(_grads(linear, x, y)[1], (x @ a).T @ g @ w_out.T, rtol=1e-4,
                               atol=1e-7)

    noisy = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, a_stddev=0.5, b_stddev=1e-3))
    b = noisy.weights[1].numpy()
    assert 0 < b.std() < 1e-2
    grad_a, grad_b = _grads(noisy, x, y)
    assert np.abs(grad_a).max() > 0 and np.abs(grad_b).max() > 0


def test_rolora_net_with_a_linked_base_kernel():
    """`base_kernel=True`: a frozen zero W0 (12, 12), linked to (A, B) with scale 1, and
    logits = ReLU(x·(W0 + A·B))·W_out (numpy)."""
    model = build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=12, rank=3, num_classes=4, a_stddev=0.5, b_stddev=0.1, base_kernel=True))
    a, b, w0, w_out = model.weights
    assert [roles.role_of(v) for v in model.weights] == ["lora_a", "lora_b", "frozen", "frozen"]
    assert [v.name for v in model.trainable_variables] == [a.name, b.name]
    assert not w0.numpy().any() and w0.shape == (12, 12)
    link = roles.lora_link(a)
    assert link.lora_b is b and link.base_kernel is w0 and link.scale == 1.0
    w0.assign(np.random.default_rng(2).normal(size=(12, 12)).astype(np.float32))
    x = np.random.default_rng(0).normal(size=(5, 12)).astype(np.float32)
    a, b, w0, w_out = (v.numpy() for v in model.weights)
    np.testing.assert_allclose(model(x).numpy(), np.maximum(x @ (w0 + a @ b), 0) @ w_out,
                               rtol=1e-5, atol=1e-5)


def test_low_rank_dense_bad_rank_and_config():
    with pytest.raises(ValueError, match="rank=0"):
        LowRankDense(4, 0)
    with pytest.raises(ValueError, match=r"rank=5 exceeds min\(d_in, d_out\)=min\(3, 4\)"):
        LowRankDense(4, 5)(tf.ones((1, 3)))
    with pytest.raises(ValueError, match="b_stddev must be >= 0"):
        LowRankDense(4, 2, b_stddev=-1.0)
    layer = LowRankDense(4, 2, stddev=0.1, seed=3, b_stddev=1e-3, base_kernel=True)
    assert LowRankDense.from_config(layer.get_config()).get_config() == layer.get_config()


@pytest.mark.parametrize("variant, classes, dims", [
    ("cifar10", 10, [(5, 5, 3, 64), (5, 5, 64, 64), (1600, 120), (120, 64), (64, 10)]),
    ("cifar100", 100, [(5, 5, 3, 64), (5, 5, 64, 128), (3200, 256), (256, 128), (128, 100)]),
])
def test_cnn_shapes_and_fedrep_roles(variant, classes, dims):
    model = build_lenet_cnn(classes, variant=variant)
    kernels = [layer.kernel for layer in model.layers if layer.weights]
    assert [tuple(k.shape) for k in kernels] == dims
    assert model(tf.zeros((2, 32, 32, 3))).shape == (2, classes)
    fc3 = model.get_layer("fc3")
    assert {roles.role_of(v) for v in fc3.weights} == {"head"}
    others = [v for v in model.weights if all(v is not w for w in fc3.weights)]
    assert {roles.role_of(v) for v in others} == {"shared"}


def test_mlp_closed_form_and_lg_split():
    model = build_mlp(input_dim=6, hidden=(5, 4, 3), num_classes=2)
    x = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    h = x
    ws = model.get_weights()
    for i in range(3):
        h = np.maximum(h @ ws[2 * i] + ws[2 * i + 1], 0)
    np.testing.assert_allclose(model(x).numpy(), h @ ws[6] + ws[7], atol=1e-5)
    lg = build_mlp(split="lg")
    by_layer = {layer.name: {roles.role_of(v) for v in layer.weights}
                for layer in lg.layers if layer.weights}
    assert by_layer == {"layer_input": {"head"}, "layer_hidden1": {"head"},
                        "layer_hidden2": {"shared"}, "layer_out": {"shared"}}
    with pytest.raises(ValueError, match="'fedavg'"):
        build_mlp(split="fedavg")


def test_tff_functional_model_of_rolora_net():
    import tensorflow_federated as tff

    def model_fn():
        tf.keras.utils.set_random_seed(0)
        return build_rolora_mnist_net(RoloraMnistNetConfig(input_dim=8, rank=2, num_classes=3))

    functional = tff.learning.models.functional_model_from_keras(
        model_fn, loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec((None, 8)), tf.TensorSpec((None,), tf.int32)))
    (a, b), (w_out,) = functional.initial_weights
    b = np.random.default_rng(0).normal(size=b.shape).astype(np.float32)
    x = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    with tf.Graph().as_default() as graph:
        out = functional.predict_on_batch(((a, b), (w_out,)), x, False)
        with tf.compat.v1.Session(graph=graph) as sess:
            got = sess.run(out)
    np.testing.assert_allclose(got, np.maximum(x @ a @ b, 0) @ w_out, atol=1e-5)


def test_shortcut_mix_closed_form_config_and_roles():
    from models.paper_models import ShortcutMix

    rng = np.random.default_rng(0)
    main, short = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(
        np.float32)
    mix = ShortcutMix(0.3)
    np.testing.assert_allclose(mix([main, short]), 0.7 * main + 0.3 * short, rtol=1e-6)
    assert ShortcutMix.from_config(mix.get_config()).get_config() == mix.get_config()
    # α = 0 is the main path bit for bit.
    np.testing.assert_array_equal(ShortcutMix(0.0)([main, short]), main)
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match=f"alpha={bad}"):
            ShortcutMix(bad)
    model = build_mlp(input_dim=5, hidden=(4, 3), num_classes=2, shortcut_alpha=0.5)
    by_role = {v.name: roles.role_of(v) for v in model.trainable_variables}
    assert by_role["shortcut/kernel:0"] == roles.SHORTCUT
    assert by_role["layer_out/kernel:0"] == roles.HEAD
    x = rng.normal(size=(2, 5)).astype(np.float32)
    # The shortcut starts at zero: the output is half the MLP's.
    plain = build_mlp(input_dim=5, hidden=(4, 3), num_classes=2)
    np.testing.assert_allclose(model(x), 0.5 * plain(x), rtol=1e-6)
    with pytest.raises(ValueError, match="alpha=2.0"):
        build_mlp(input_dim=5, hidden=(4,), num_classes=2, shortcut_alpha=2.0)
