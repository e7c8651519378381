"""Classifier head over BERT/RoBERTa with LoRA: roles, exactness, training, TFF model wrappers."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from models.backbones import (build_bert_backbone, build_classifier, build_roberta_backbone,
                              dummy_batch)
from models.lora_targets import LoraConfig, apply_lora
from tffl.engine import roles
from tests.tiers import tiered


def _lora_classifier(kind="bert", num_classes=3):
    build = build_bert_backbone if kind == "bert" else build_roberta_backbone
    backbone = build(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16,
                     intermediate_dim=24, max_sequence_length=16)
    model = build_classifier(backbone, num_classes)
    return backbone, model


def _numpy_features(backbone, batch, pooling):
    """The pooled features computed in numpy from the backbone's last hidden state."""
    out = backbone(batch)
    h = (out["sequence_output"] if isinstance(out, dict) else out).numpy()
    if pooling == "mean":
        m = np.asarray(batch["padding_mask"], np.float64)[:, :, None]
        return (h * m).sum(axis=1) / m.sum(axis=1)
    if pooling == "cls":
        return h[:, 0, :]
    pooler = backbone.pooled_dense
    return np.tanh(h[:, 0, :] @ pooler.kernel.numpy() + pooler.bias.numpy())


def _padded_batch(backbone):
    batch = dummy_batch(backbone, batch_size=3, seq_len=5)
    batch["padding_mask"] = tf.constant([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]],
                                        tf.int32)
    return batch


# Fast tier: every family and pooling once, the two heads alternating; large: the other head.
@pytest.mark.parametrize("kind,pooling,head", tiered(
    [(k, p, h) for h in ("linear", "dense_tanh") for k, p in (
        ("bert", "mean"), ("bert", "cls"), ("bert", "pooler"), ("roberta", "mean"),
        ("roberta", "cls"))],
    fast=[("bert", "mean", "linear"), ("bert", "cls", "dense_tanh"), ("bert", "pooler", "linear"),
          ("roberta", "mean", "dense_tanh"), ("roberta", "cls", "linear")]))
def test_logits_are_the_head_on_numpy_pooled_features(kind, pooling, head):
    build = build_bert_backbone if kind == "bert" else build_roberta_backbone
    backbone = build(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16,
                     intermediate_dim=24, max_sequence_length=16)
    model = build_classifier(backbone, 3, pooling=pooling, head=head)
    batch = _padded_batch(backbone)
    feats = _numpy_features(backbone, batch, pooling)
    if head == "dense_tanh":
        dense = model.get_layer("head_dense")
        feats = np.tanh(feats @ dense.kernel.numpy() + dense.bias.numpy())
    out = model.get_layer("head")
    expected = feats @ out.kernel.numpy() + out.bias.numpy()
    np.testing.assert_allclose(model(batch).numpy(), expected, atol=1e-5)


def test_pooler_needs_a_backbone_with_one():
    backbone = build_roberta_backbone(vocabulary_size=64, num_layers=1, hidden_dim=16,
                                      intermediate_dim=24)
    with pytest.raises(ValueError, match="no pooler"):
        build_classifier(backbone, 2, pooling="pooler")
    with pytest.raises(ValueError, match="pooling='max'"):
        build_classifier(backbone, 2, pooling="max")


# Fast tier: BERT's pooler (the layer the old classifier left frozen) with both heads, mean and
# cls with one each, RoBERTa (no pooler; its dense + tanh + out_proj head) once; large: the rest.
@pytest.mark.parametrize("kind,pooling,head", tiered(
    [("bert", p, h) for h in ("linear", "dense_tanh") for p in ("mean", "cls", "pooler")]
    + [("roberta", p, h) for h in ("linear", "dense_tanh") for p in ("mean", "cls")],
    fast=[("bert", "mean", "linear"), ("bert", "cls", "dense_tanh"),
          ("bert", "pooler", "linear"), ("bert", "pooler", "dense_tanh"),
          ("roberta", "cls", "dense_tanh")]))
def test_no_frozen_variable_between_backbone_output_and_logits(kind, pooling, head):
    """Every variable that the logits depend on, other than the encoders' and embeddings', is
    trainable and tagged `head`: the gradient of the logits reaches no frozen layer after the
    last hidden state (the old classifier's frozen pooler would fail this)."""
    build = build_bert_backbone if kind == "bert" else build_roberta_backbone
    backbone = build(vocabulary_size=64, num_layers=2, hidden_dim=16, intermediate_dim=24,
                     max_sequence_length=16)
    apply_lora(backbone, LoraConfig(rank=2))
    model = build_classifier(backbone, 3, pooling=pooling, head=head)
    pooler = getattr(backbone, "pooled_dense", None)
    encoder_side = {id(v) for layer in backbone.layers if layer is not pooler
                    for v in layer.weights}
    batch = _padded_batch(backbone)
    with tf.GradientTape() as tape:
        tape.watch(model.variables)
        logits = model(batch)
    grads = tape.gradient(logits, model.variables,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    reached = [v for v, g in zip(model.variables, grads)
               if id(v) not in encoder_side and np.any(g.numpy() != 0)]
    trainable = {id(v) for v in model.trainable_variables}
    assert reached and all(id(v) in trainable for v in reached)
    assert all(roles.role_of(v) == roles.HEAD for v in reached)
    pooler_reached = pooler is not None and any(v is pooler.kernel for v in reached)
    assert pooler_reached == (pooling == "pooler")


def test_lora_classifier_trainables_and_exactness():
    backbone, model = _lora_classifier()
    batch = dummy_batch(backbone, batch_size=2, seq_len=6)
    before = model(batch).numpy()
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    np.testing.assert_array_equal(model(batch).numpy(), before)
    groups = roles.variables_by_role(model.trainable_variables)
    assert len(groups["lora_a"]) == len(groups["lora_b"]) == 4 and len(groups["head"]) == 2
    assert sum(len(v) for v in groups.values()) == len(model.trainable_variables)


def test_bad_num_classes():
    with pytest.raises(ValueError, match="num_classes=0"):
        build_classifier(build_bert_backbone(vocabulary_size=8), 0)


def test_keras_fit_moves_only_trainable_roles():
    backbone, model = _lora_classifier()
    apply_lora(backbone, LoraConfig(rank=2))
    frozen = [v.numpy().copy() for v in roles.select(model.weights, [roles.FROZEN])]
    b0 = [v.numpy().copy() for v in roles.select(model.weights, [roles.LORA_B])]
    batch = dummy_batch(backbone, batch_size=8, seq_len=6)
    labels = np.arange(8) % 3
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(batch, labels, epochs=2, verbose=0)
    for v, old in zip(roles.select(model.weights, [roles.FROZEN]), frozen):
        np.testing.assert_array_equal(v.numpy(), old)
    assert any(not np.array_equal(v.numpy(), old)
               for v, old in zip(roles.select(model.weights, [roles.LORA_B]), b0))


def _input_spec(backbone, seq_len=6):
    x = collections.OrderedDict(
        (k, tf.TensorSpec((None, seq_len), tf.int32)) for k in sorted(backbone.input))
    return (x, tf.TensorSpec((None,), tf.int32))


def test_tff_from_keras_model_forward_pass():
    import tensorflow_federated as tff

    backbone, model = _lora_classifier()
    apply_lora(backbone, LoraConfig(rank=2))
    batch = dummy_batch(backbone, batch_size=2, seq_len=6)
    expected = model(batch).numpy()
    tff_model = tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=_input_spec(backbone))
    trainable = tff_model.trainable_variables
    assert {roles.role_of(v) for v in trainable} == {"lora_a", "lora_b", "head"}
    assert sum(int(np.prod(v.shape)) for v in trainable) == (
        2 * 2 * 2 * (16 + 16) + 16 * 3 + 3)  # 2 layers x {q, v} x r(d_in + d_out) + head
    np.testing.assert_allclose(tff_model.predict_on_batch(batch, training=False), expected,
                               atol=1e-6)
    traced = tf.function(lambda b: tff_model.predict_on_batch(b, training=False))
    np.testing.assert_allclose(traced(batch), expected, atol=1e-5)


