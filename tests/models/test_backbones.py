"""Classifier head over BERT/RoBERTa with LoRA: roles, exactness, training, TFF model wrappers."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from models.backbones import (build_bert_backbone, build_classifier, build_roberta_backbone,
                              dummy_batch)
from models.lora_targets import LoraConfig, apply_lora
from tffl import roles


def _lora_classifier(kind="bert", num_classes=3):
    build = build_bert_backbone if kind == "bert" else build_roberta_backbone
    backbone = build(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16,
                     intermediate_dim=24, max_sequence_length=16)
    model = build_classifier(backbone, num_classes)
    return backbone, model


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_head_is_dense_on_pooled_features(kind):
    backbone, model = _lora_classifier(kind)
    batch = dummy_batch(backbone, batch_size=3, seq_len=5)
    out = backbone(batch)
    feats = out["pooled_output"] if kind == "bert" else out[:, 0, :]
    head = model.get_layer("head")
    expected = feats.numpy() @ head.kernel.numpy() + head.bias.numpy()
    np.testing.assert_allclose(model(batch).numpy(), expected, atol=1e-5)
    assert [roles.role_of(v) for v in head.weights] == ["head", "head"]


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


